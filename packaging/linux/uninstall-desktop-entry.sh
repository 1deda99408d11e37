#!/bin/sh
# Remove what install-desktop-entry.sh installed. Chats, settings, the demo model and the kernel cache
# (in ~/.local/share/rigllm and ~/.config/rigllm) are the user's and stay.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data_home=${XDG_DATA_HOME:-$HOME/.local/share}

rm -f "$data_home/applications/rigllm.desktop"
rm -f "$data_home"/icons/hicolor/*/apps/rigllm.png "$data_home/icons/hicolor/scalable/apps/rigllm.svg"
rm -f "$data_home/mime/packages/rigllm-gguf.xml"

. "$here/refresh-desktop-caches.sh"
refresh_desktop_caches "$data_home"
echo "removed rigllm's desktop entry, icons and GGUF file type from $data_home"
