"""Patches made in the open to engine files (the CPU lane's torchvision fix), each with its note.
A build action: standard library only."""
