package childproc

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// ExitText says how a process ended, for people: "exit status 1",
// "ended by SIGKILL".
func ExitText(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			switch sig := ws.Signal(); sig {
			case syscall.SIGTERM:
				return "ended by SIGTERM"
			case syscall.SIGKILL:
				return "ended by SIGKILL"
			default:
				return "ended by signal " + sig.String()
			}
		}
		return ee.Error()
	default:
		return err.Error()
	}
}

// Tail returns the last n lines of a log file, indented, so an error
// message says why a child failed without sending the reader to the log.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	lines = lines[max(0, len(lines)-n):]
	var sb strings.Builder
	for _, l := range lines {
		sb.WriteString("  | ")
		sb.Write(l)
		sb.WriteByte('\n')
	}
	return strings.TrimRight(sb.String(), "\n")
}
