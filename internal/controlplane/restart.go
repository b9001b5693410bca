package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// RestartAPIServer stops kube-apiserver as an operator's restart does
// (SIGTERM, SIGKILL after a minute) and starts it again with the same
// command line and environment, on the same port, certificates and etcd:
// every client's connections and watches break, and the new server's watch
// cache starts from etcd. envtest can only restart with new certificates,
// which no running client would trust, so the process is restarted here,
// and Stop stops the new one. It returns once the server answers /readyz.
func (c *ControlPlane) RestartAPIServer(ctx context.Context) error {
	if c.env == nil || existing(c.env.UseExistingCluster) {
		return errors.New("restarting kube-apiserver: not a control plane this process started")
	}
	pid := 0
	if c.apiServer != nil {
		pid = c.apiServer.Process.Pid
	} else {
		p, err := childNamed("kube-apiserver")
		if err != nil {
			return fmt.Errorf("restarting kube-apiserver: %w", err)
		}
		pid = p
	}
	args, err := procStrings(pid, "cmdline")
	if err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	env, err := procStrings(pid, "environ")
	if err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	if err := c.stopAPIServer(pid); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	if c.restartLog != "" {
		log, err := os.OpenFile(c.restartLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("restarting kube-apiserver: opening its log: %w", err)
		}
		// The child holds its own descriptor: ours closes now.
		defer log.Close()
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	c.apiServer = cmd
	c.apiServerDone = make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(c.apiServerDone)
	if err := WaitReady(ctx, c.Config, 2*time.Minute); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	return nil
}

// WaitReady waits until the API server of cfg answers /readyz with "ok",
// for at most timeout: after a restart, whether this package's or a node's,
// a server that accepts connections may still be starting its informers
// and post-start hooks, and a fault is only over when it is ready.
func WaitReady(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("waiting for the API server's /readyz: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("the API server did not answer /readyz within %s: %w", timeout, err)
	}
	return nil
}

// stopAPIServer stops the API server process pid, the one envtest started
// or the one RestartAPIServer did, and waits until it is gone.
func (c *ControlPlane) stopAPIServer(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signalling kube-apiserver (pid %d): %w", pid, err)
	}
	gone := func() bool {
		if c.apiServer != nil && c.apiServer.Process.Pid == pid {
			select {
			case <-c.apiServerDone:
				return true
			default:
				return false
			}
		}
		// envtest's child: envtest reaps it.
		_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
		return err != nil
	}
	for deadline := time.Now().Add(time.Minute); !gone(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = p.Signal(syscall.SIGKILL)
			deadline = time.Now().Add(time.Minute)
		}
	}
	return nil
}

// childNamed returns the pid of this process's child whose command is name.
func childNamed(name string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, the last ')' ends it.
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || s[open+1:end] != name {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no child process %s of pid %d", name, self)
}

// procStrings reads a NUL-separated file of /proc/pid: cmdline, environ.
func procStrings(pid int, file string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), file))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
		out = append(out, string(f))
	}
	if len(out) == 0 || out[0] == "" {
		return nil, fmt.Errorf("pid %d has an empty %s", pid, file)
	}
	return out, nil
}
