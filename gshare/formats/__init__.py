"""Format modules (``FORMAT_MODULE_PATH``): how the console writes dates and times, whatever the language."""
