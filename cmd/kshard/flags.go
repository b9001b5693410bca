package main

import "flag"

// flagSetOf collects Go flags that a library binds (zap's logging flags) into
// a set that cobra can adopt.
func flagSetOf(bind func(*flag.FlagSet)) *flag.FlagSet {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	bind(fs)
	return fs
}
