//go:build unix

package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary, started as a child, act one of the
// helper children below instead of running the tests.
const helperEnv = "CHILDPROC_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "sleep": // ends with exit status 0 on SIGTERM
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("ready")
		<-term
		os.Exit(0)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		select {}
	case "exit":
		fmt.Println("giving up")
		os.Exit(3)
	}
}

// startHelper starts the test binary as the helper child mode and waits
// until it is ready.
func startHelper(t *testing.T, s *Supervisor, mode string) (*Process, string) {
	t.Helper()
	t.Setenv(helperEnv, mode)
	log := filepath.Join(t.TempDir(), mode+".log")
	p, err := s.Start(mode, os.Args[0], log, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	for mode != "exit" {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), "ready") {
			break
		}
		if !p.Running() {
			t.Fatalf("%s ended before it was ready:\n%s", mode, Tail(log, 10))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, log
}

func TestStopAndKill(t *testing.T) {
	s := NewSupervisor(func(err error) { t.Errorf("unexpected exit: %v", err) })
	defer s.StopAll(time.Minute)
	p, log := startHelper(t, s, "sleep")
	if b, _ := os.ReadFile(log); !strings.HasPrefix(string(b), "=== ") || !strings.Contains(string(b), os.Args[0]) {
		t.Errorf("the log does not start with the command line:\n%s", b)
	}
	if _, err := p.Stop(time.Minute); err != nil {
		t.Errorf("stopping a child that ends on SIGTERM: %v", err)
	}
	if p.Running() {
		t.Error("running after Stop")
	}

	p, _ = startHelper(t, s, "ignore-term")
	if _, err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); ExitText(err) != "ended by SIGKILL" {
		t.Errorf("killed child: %s", ExitText(err))
	}
}

func TestGraceExpired(t *testing.T) {
	s := NewSupervisor(func(err error) { t.Errorf("unexpected exit: %v", err) })
	defer s.StopAll(time.Minute)
	p, _ := startHelper(t, s, "ignore-term")
	if err := p.Terminate(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); !errors.Is(err, ErrGraceExpired) || !strings.Contains(err.Error(), "ignore-term did not stop within 100ms") {
		t.Errorf("a child ignoring SIGTERM ended with %v, want ErrGraceExpired", err)
	}
}

func TestUnexpectedExit(t *testing.T) {
	errc := make(chan error, 1)
	s := NewSupervisor(func(err error) { errc <- err })
	defer s.StopAll(time.Minute)
	startHelper(t, s, "exit")
	err := <-errc
	for _, want := range []string{"exit (pid ", "exited on its own (exit status 3)", "| giving up"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

// TestPauseThenStop: a paused child is stopped, not left to its grace
// period (Terminate resumes it to handle the SIGTERM).
func TestPauseThenStop(t *testing.T) {
	s := NewSupervisor(func(err error) { t.Errorf("unexpected exit: %v", err) })
	defer s.StopAll(time.Minute)
	p, _ := startHelper(t, s, "sleep")
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" {
		for {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
			if err != nil {
				t.Fatal(err)
			}
			// The state follows the command name in parentheses.
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); f[0] == "T" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := p.Stop(10 * time.Minute); err != nil {
		t.Errorf("stopping a paused child: %v", err)
	}
}

func TestPeakRSS(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM is Linux's")
	}
	s := NewSupervisor(nil)
	defer s.StopAll(time.Minute)
	p, _ := startHelper(t, s, "sleep")
	if peak, ok := p.PeakRSS(); !ok || peak < 1<<20 {
		t.Errorf("peak RSS of a running Go program: %v (%v)", peak, ok)
	}
	if _, err := p.Stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.PeakRSS(); ok {
		t.Error("a peak RSS of a child that ended")
	}
}

func TestParseStatusBytes(t *testing.T) {
	status := "Name:\tkshard\nVmPeak:\t 2000000 kB\nVmHWM:\t  307200 kB\nVmRSS:\t  204800 kB\n"
	if b, ok := parseStatusBytes(status, "VmHWM:"); !ok || b != 300<<20 {
		t.Errorf("VmHWM %v (%v), want 300 MiB", b, ok)
	}
	if _, ok := parseStatusBytes("Name:\tkshard\n", "VmHWM:"); ok {
		t.Error("no VmHWM, yet a peak")
	}
}
