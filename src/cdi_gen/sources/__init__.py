"""Where device records come from: udev (the only pyudev user) behind a small protocol."""
