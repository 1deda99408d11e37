"""Widgets of the desktop app; only the GUI thread creates or touches them."""
