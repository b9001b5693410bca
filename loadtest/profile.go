package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// profiles takes the pprof profiles of one fleet's measured phase
// (Options.Profile): a CPU profile of every replica over the phase, and a
// heap profile of each and of the API server at its end. They answer where
// a fleet's time and memory go, which the report's counts only locate.
type profiles struct {
	dir string
	hc  *http.Client
	// apiServer reaches the API server's /debug/pprof with the load
	// tester's credentials; nil when it cannot be built.
	apiServer *http.Client
	wg        sync.WaitGroup
}

// beginProfiles starts a CPU profile of every running replica of f for
// the phase's duration d; nil without Options.Profile.
func (b *bench) beginProfiles(ctx context.Context, f *fleet, d time.Duration) *profiles {
	if !b.opts.Profile {
		return nil
	}
	p := &profiles{dir: filepath.Join(b.work, "profiles"), hc: &http.Client{Timeout: d + time.Minute}}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		b.log.Error(err, "Creating the profile folder")
		return nil
	}
	if hc, err := rest.HTTPClientFor(b.restConfig); err == nil {
		p.apiServer = hc
	} else {
		b.log.Error(err, "A client of the API server's profiles")
	}
	secs := max(int(d.Seconds()), 1)
	for _, s := range f.runningSlots() {
		if s.pprofAddr == "" {
			continue
		}
		p.wg.Go(func() {
			if err := p.fetch(ctx, s.pprofAddr, fmt.Sprintf("profile?seconds=%d", secs), p.file(f, s, "cpu")); err != nil {
				b.log.Error(err, "Taking a CPU profile", "replica", s.id)
			}
		})
	}
	return p
}

// end takes the heap profiles and waits for the CPU profiles.
func (p *profiles) end(ctx context.Context, r *run, f *fleet) {
	if p == nil {
		return
	}
	for _, s := range f.runningSlots() {
		if s.pprofAddr == "" {
			continue
		}
		if err := p.fetch(ctx, s.pprofAddr, "heap?gc=1", p.file(f, s, "heap")); err != nil {
			r.log.Error(err, "Taking a heap profile", "replica", s.id)
		}
	}
	if p.apiServer != nil {
		// In use and allocated since the API server started: what holds
		// its memory at the phase's end, and what churned it meanwhile.
		// (Not gc=1: a collection forced in the API server would change
		// the RSS the report reads next.)
		path := p.file(f, &slot{id: "kube-apiserver"}, "heap")
		if err := p.get(ctx, p.apiServer, strings.TrimSuffix(r.restConfig.Host, "/")+"/debug/pprof/heap", path); err != nil {
			r.log.Error(err, "Taking the API server's heap profile")
		}
	}
	p.wg.Wait()
	r.progress.printf("profiles of %s in %s", f.label(), p.dir)
}

// file names a profile after its fleet, replica and kind:
// sharded-x4.kshard-0.cpu.pprof.
func (p *profiles) file(f *fleet, s *slot, kind string) string {
	fleet := strings.NewReplacer(" ", "-", "×", "x", "→", "-").Replace(f.label())
	return filepath.Join(p.dir, fmt.Sprintf("%s.%s.%s.pprof", fleet, s.id, kind))
}

// fetch writes a replica's profile what (its /debug/pprof path) to path.
func (p *profiles) fetch(ctx context.Context, addr, what, path string) error {
	return p.get(ctx, p.hc, "http://"+addr+"/debug/pprof/"+what, path)
}

// get writes what url answers to path.
func (p *profiles) get(ctx context.Context, hc *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: %s", url, resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		_ = out.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return out.Close()
}
