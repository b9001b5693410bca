package sandbox

import (
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/kshard/kshard/internal/childproc"
)

// screen is the sandbox's only way to the person reading it. Messages scroll;
// the live view sits under them. On a terminal the view is a footer redrawn
// in place (two ANSI escapes, no curses); anywhere else (a log file, CI, a
// test) each view is printed as a new table, because escape codes would make
// a log unreadable. One lock serialises the two, so a message never lands in
// the middle of a table.
type screen struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	view   []string // the live view, redrawn after every message on a terminal
	drawn  int      // lines of the view currently on the terminal
	closed bool
}

func newScreen(w io.Writer) *screen {
	return &screen{w: w, tty: childproc.IsTerminal(w)}
}

// printf writes a message (a newline is added) above the live view.
func (s *screen) printf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	msg := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	_, _ = io.WriteString(s.w, msg)
	s.draw()
}

// show replaces the live view.
func (s *screen) show(lines []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if !s.tty {
		_, _ = io.WriteString(s.w, "\n"+strings.Join(lines, "\n")+"\n\n")
		return
	}
	s.erase()
	s.view = lines
	s.draw()
}

// freeze leaves the last view where it is and stops redrawing it, so the
// shutdown messages that follow scroll below it.
func (s *screen) freeze() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view, s.drawn, s.closed = nil, 0, true
}

func (s *screen) erase() {
	if s.tty && s.drawn > 0 {
		// Cursor up to the view's first line, then clear to the end of the screen.
		fmt.Fprintf(s.w, "\x1b[%dA\r\x1b[J", s.drawn)
		s.drawn = 0
	}
}

func (s *screen) draw() {
	if !s.tty || len(s.view) == 0 {
		return
	}
	_, _ = io.WriteString(s.w, strings.Join(s.view, "\n")+"\n")
	s.drawn = len(s.view)
}
