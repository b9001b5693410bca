package netfault

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestDelayHoldsClientBytes: what a client sends during a delay reaches the
// server no earlier than the delay after it was sent (a lower bound, which
// a slow machine can only make later), in order, and the server's answers
// are not held.
func TestDelayHoldsClientBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type line struct {
		s  string
		at time.Time
	}
	got := make(chan line, 10)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("hello\n")) // the server speaks first
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			got <- line{sc.Text(), time.Now()}
		}
	}()
	p, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("before\n")); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l.s != "before" {
		t.Fatalf("got %q, want before", l.s)
	}

	const delay = 2 * time.Second
	p.Delay(delay)
	sent := time.Now()
	for _, s := range []string{"one\n", "two\n"} {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Responses flow while requests are held.
	if s, err := r.ReadString('\n'); err != nil || s != "hello\n" {
		t.Fatalf("read %q, %v from the server during the delay", s, err)
	}
	for _, want := range []string{"one", "two"} {
		select {
		case l := <-got:
			if l.s != want {
				t.Fatalf("got %q, want %q: order lost", l.s, want)
			}
			if early := delay - l.at.Sub(sent); early > 0 {
				t.Errorf("%q reached the server %s before its delay ended", l.s, early)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%q never reached the server", want)
		}
	}
	if p.Delayed() == 0 {
		t.Error("no chunk counted as delayed")
	}
}

// TestPartitionHoldsBothWays: during a partition neither side hears the
// other; when it heals, what each sent arrives, in order, no earlier than
// the heal (a lower bound, which a slow machine can only make later).
func TestPartitionHoldsBothWays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type line struct {
		s  string
		at time.Time
	}
	got := make(chan line, 10)
	serverConn := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		serverConn <- c
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			got <- line{sc.Text(), time.Now()}
		}
	}()
	p, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("before\n")); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l.s != "before" {
		t.Fatalf("got %q, want before", l.s)
	}
	sc := <-serverConn
	defer sc.Close()

	const d = 2 * time.Second
	p.Partition(d)
	cut := time.Now()
	if _, err := c.Write([]byte("request\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Write([]byte("answer\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	s, err := r.ReadString('\n')
	if err != nil || s != "answer\n" {
		t.Fatalf("read %q, %v from the server", s, err)
	}
	if early := d - time.Since(cut); early > 0 {
		t.Errorf("the server's answer reached the client %s before the partition healed", early)
	}
	select {
	case l := <-got:
		if l.s != "request" {
			t.Fatalf("got %q, want request", l.s)
		}
		if early := d - l.at.Sub(cut); early > 0 {
			t.Errorf("the request reached the server %s before the partition healed", early)
		}
	case <-time.After(time.Minute):
		t.Fatal("the request never reached the server")
	}
	if p.Delayed() < 2 {
		t.Errorf("%d chunks counted as held, want both ways", p.Delayed())
	}
}

// TestCutEndsOpenConnections: a cut ends the connection open through the
// proxy on the client's side, and a new one works.
func TestCutEndsOpenConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					_, _ = c.Write([]byte(sc.Text() + "\n")) // echo
				}
			}()
		}
	}()
	p, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func(c net.Conn, s string) error {
		if _, err := c.Write([]byte(s + "\n")); err != nil {
			return err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && got != s+"\n" {
			t.Fatalf("echo %q, want %q", got, s)
		}
		return err
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c, "before"); err != nil {
		t.Fatal(err)
	}
	if n := p.Cut(); n != 1 {
		t.Errorf("Cut() = %d connections, want 1", n)
	}
	if err := echo(c, "after"); err == nil {
		t.Error("the cut connection still answers")
	}
	again, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := echo(again, "again"); err != nil {
		t.Errorf("a connection after the cut: %v", err)
	}
}

// TestLatencyDelaysEveryRequest: with a latency set, each of several
// requests sent over time reaches the server no earlier than the latency
// after it was sent (a lower bound, which a slow machine can only make
// later), in order; none of them counts as a fault's delay.
func TestLatencyDelaysEveryRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan time.Time, 10)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			got <- time.Now()
		}
	}()
	p, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const latency = 300 * time.Millisecond
	p.SetLatency(latency)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 3 {
		sent := time.Now()
		if _, err := c.Write([]byte("request\n")); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-got:
			if early := latency - at.Sub(sent); early > 0 {
				t.Errorf("request %d reached the server %s before its latency", i, early)
			}
		case <-time.After(time.Minute):
			t.Fatalf("request %d never reached the server", i)
		}
	}
	if p.Delayed() != 0 {
		t.Errorf("%d chunks counted as a fault's delay", p.Delayed())
	}
}
