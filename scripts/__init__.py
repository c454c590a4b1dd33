"""The gputrain controller: CLI, lifecycle, fleet operations over SSH, verification, launch."""
