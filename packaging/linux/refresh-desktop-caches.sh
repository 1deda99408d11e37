# Sourced by install-/uninstall-desktop-entry.sh: rebuild the per-user caches that menus, icon themes and
# file managers read, with whichever of the tools this desktop has (none is required).
refresh_desktop_caches() {
    if command -v update-desktop-database >/dev/null 2>&1 && [ -d "$1/applications" ]; then
        update-desktop-database -q "$1/applications"
    fi
    if command -v update-mime-database >/dev/null 2>&1 && [ -d "$1/mime/packages" ]; then
        update-mime-database "$1/mime"
    fi
    if [ -d "$1/icons/hicolor" ]; then
        touch "$1/icons/hicolor"
        if command -v gtk-update-icon-cache >/dev/null 2>&1; then
            gtk-update-icon-cache -q -t -f "$1/icons/hicolor" || true
        fi
    fi
}
