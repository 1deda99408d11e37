"""Entry of the Windows bundle's windowed `rigllm-gui.exe`: `rigllm gui [MODEL]` without a console window."""

import sys

# Windows groups taskbar buttons and pinned shortcuts by this id. Without it the window is grouped under
# the launching process's id and shows no rigllm icon when pinned; the Start Menu shortcut that an
# installer creates must carry the same id (packaging/README.md). Format: Company.Product.SubProduct.
APP_USER_MODEL_ID = "rigllm.rigllm.gui"


def _set_app_user_model_id() -> None:
    import ctypes

    ctypes.windll.shell32.SetCurrentProcessExplicitAppUserModelID(APP_USER_MODEL_ID)


if __name__ == "__main__":
    if sys.platform == "win32":  # the spec is also built on Linux to check it; there this is a no-op
        _set_app_user_model_id()
    from engine.cli import main

    sys.exit(main(["gui", *sys.argv[1:]]))
