"""One module per ``draslice`` subcommand (or group of subcommands)."""
