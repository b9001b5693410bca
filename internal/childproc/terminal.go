package childproc

import (
	"io"
	"os"
)

// IsTerminal reports whether w is a character device whose terminal
// understands cursor movement (TERM is not "dumb"): where the sandbox and
// the load tester redraw their live view in place instead of appending.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	return os.Getenv("TERM") != "dumb"
}
