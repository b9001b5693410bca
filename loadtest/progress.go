package loadtest

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kshard/kshard/internal/childproc"
)

// plainEvery is how often the status is printed as a new line when the
// output is not a terminal (a log file, CI, a test).
const plainEvery = 10 * time.Second

// progress is the run's only way to the person watching. Messages scroll;
// on a terminal the status sits under them on one line redrawn in place
// (carriage return and erase-line, no curses); elsewhere the status is
// printed as a plain line every plainEvery, so a log stays readable.
type progress struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	status   string
	drawn    bool
	lastLine time.Time
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, tty: childproc.IsTerminal(w)}
}

// printf writes a message line above the status.
func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.erase()
	msg := strings.TrimRight(fmt.Sprintf(format, args...), "\n")
	fmt.Fprintln(p.w, msg)
	p.draw()
}

// update replaces the status line.
func (p *progress) update(status string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = status
	if p.tty {
		p.erase()
		p.draw()
		return
	}
	if time.Since(p.lastLine) >= plainEvery {
		fmt.Fprintln(p.w, status)
		p.lastLine = time.Now()
	}
}

// close leaves the status line on screen and moves below it.
func (p *progress) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
	p.status = ""
}

func (p *progress) erase() {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

func (p *progress) draw() {
	if p.tty && p.status != "" {
		fmt.Fprint(p.w, p.status)
		p.drawn = true
	}
}
