#!/bin/sh
# Install rigllm's desktop entry, hicolor icons and the GGUF file type for the current user
# (under ${XDG_DATA_HOME:-~/.local/share}; no root). Runs from the PyInstaller bundle (dist/rigllm/),
# a wheel install (<prefix>/share/rigllm/linux/) or a source checkout (packaging/linux/); the entry runs
# that install's rigllm (the bundle's executable, the wheel's <prefix>/bin/rigllm, else rigllm on PATH).
#
#   install-desktop-entry.sh [--exec /path/to/rigllm]
#
# Exec is written as an absolute path: a desktop session's PATH often lacks the venv or ~/.local/bin
# that a terminal has, and then the menu entry would silently do nothing.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
# Where this script lies decides where the icons and the default executable are.
if [ -d "$here/_internal/resources/icons" ]; then          # PyInstaller bundle: dist/rigllm/
    icons="$here/_internal/resources/icons"; default_exe="$here/rigllm"
elif [ -d "$here/../resources/icons" ]; then               # wheel: <prefix>/share/rigllm/linux/
    icons="$here/../resources/icons"; default_exe="$here/../../../bin/rigllm"
elif [ -d "$here/../../resources/icons" ]; then            # source checkout: packaging/linux/
    icons="$here/../../resources/icons"; default_exe=""
else
    echo "error: no icons found near $here (not a bundle, wheel install or checkout?)" >&2; exit 1
fi
[ -x "$default_exe" ] || default_exe=$(command -v rigllm || true)

case "${1:-}" in
    --exec) [ $# -eq 2 ] || { echo "usage: $0 [--exec /path/to/rigllm]" >&2; exit 2; }; exe=$2 ;;
    "") [ $# -eq 0 ] || { echo "usage: $0 [--exec /path/to/rigllm]" >&2; exit 2; }; exe=$default_exe ;;
    *) echo "usage: $0 [--exec /path/to/rigllm]" >&2; exit 2 ;;
esac
[ -n "$exe" ] || { echo "error: no rigllm executable found: pip install rigllm or pass --exec PATH" >&2; exit 1; }
[ -x "$exe" ] && [ -f "$exe" ] || { echo "error: $exe is not an executable" >&2; exit 1; }
exe="$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")"   # absolute, without ../ steps
case "$exe" in
    *[\"\`\$\\%]*) echo "error: the path $exe has a character a desktop entry cannot quote simply (\" \` \$ \\ %)" >&2; exit 1 ;;
esac

data_home=${XDG_DATA_HOME:-$HOME/.local/share}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
# Exec takes a quoted path (spaces are fine inside quotes); TryExec takes the bare path.
sed_exe=$(printf '%s' "$exe" | sed 's/[|&]/\\&/g')   # | and & are special in a sed replacement
sed -e "s|^Exec=rigllm |Exec=\"$sed_exe\" |" -e "s|^TryExec=rigllm\$|TryExec=$sed_exe|" "$here/rigllm.desktop" \
    >"$staging/rigllm.desktop"

# A plain copy plus update-desktop-database (below) is all the spec asks; xdg-desktop-menu 1.1.x would
# also write legacy copies (~/.gnome/apps) that an uninstall can miss.
mkdir -p "$data_home/applications"
cp "$staging/rigllm.desktop" "$data_home/applications/rigllm.desktop"

for png in "$icons"/hicolor/*/apps/rigllm.png "$icons"/hicolor/scalable/apps/rigllm.svg; do
    rel=${png#"$icons"/hicolor/}
    mkdir -p "$data_home/icons/hicolor/$(dirname "$rel")"
    cp "$png" "$data_home/icons/hicolor/$rel"
done

mkdir -p "$data_home/mime/packages"
cp "$here/rigllm-gguf.xml" "$data_home/mime/packages/rigllm-gguf.xml"

. "$here/refresh-desktop-caches.sh"
refresh_desktop_caches "$data_home"
echo "installed rigllm.desktop (Exec=$exe gui %f), icons and the GGUF file type under $data_home"
