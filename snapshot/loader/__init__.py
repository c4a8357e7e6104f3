"""The DataLoader2 front end: its iterator, position, save and restore."""
