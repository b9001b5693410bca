package sandbox

import (
	"bytes"
	"testing"
)

// On a terminal the view is a footer: a message erases it, is written, and
// the view is drawn again under it, so messages scroll above a fixed table.
func TestScreenFooter(t *testing.T) {
	var b bytes.Buffer
	s := &screen{w: &b, tty: true}
	s.show([]string{"v1", "v2"})
	s.printf("hello")
	s.show([]string{"w1"})
	want := "v1\nv2\n" + "\x1b[2A\r\x1b[J" + "hello\n" + "v1\nv2\n" + "\x1b[2A\r\x1b[J" + "w1\n"
	if got := b.String(); got != want {
		t.Errorf("terminal output = %q\nwant %q", got, want)
	}

	// Elsewhere every view is a new block and there is no escape code.
	b.Reset()
	s = &screen{w: &b}
	s.show([]string{"v1"})
	s.printf("hello")
	if got := b.String(); got != "\nv1\n\nhello\n" {
		t.Errorf("log output = %q", got)
	}
}
