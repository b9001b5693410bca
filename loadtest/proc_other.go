//go:build !unix

package loadtest

import "errors"

// errNoPause says this system cannot stop a process and let it go on.
var errNoPause = errors.New("pausing a process (SIGSTOP) needs a Unix system")

// pause is unsupported here: the chaos scenario's pause fault fails.
func (p *process) pause() error { return errNoPause }

// resume has nothing to resume here.
func (p *process) resume() error { return nil }
