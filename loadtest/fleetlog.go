package loadtest

import (
	"slices"
	"strconv"
	"sync"
	"time"
)

// fleetLog is the run's fleets, one after another, and the one running
// now: where the ring watch and the audit evidence find the process behind
// a holder at a given time, and where a StatefulSet's new container joins
// the fleet that runs.
type fleetLog struct {
	mu      sync.Mutex
	current *fleet
	all     []*fleet
}

// start makes f the running fleet, named for its place in the run.
func (l *fleetLog) start(f *fleet) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.current = f
	f.id = "fleet-" + strconv.Itoa(len(l.all)+1)
	l.all = append(l.all, f)
}

// stopped says f runs no more.
func (l *fleetLog) stopped(f *fleet) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current == f {
		l.current = nil
	}
}

// running is the fleet running now, nil between fleets.
func (l *fleetLog) running() *fleet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current
}

// list is every fleet the run started, in order.
func (l *fleetLog) list() []*fleet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// processOf is the newest process of replica id, in any fleet of the run,
// started at or before at; nil if none. Fleets run one after another, so
// the newest is the one that ran then, if any did.
func (l *fleetLog) processOf(id string, at time.Time) *instance {
	var newest *instance
	for _, f := range l.list() {
		if in := f.processOf(id, at); in != nil && (newest == nil || in.proc.Started().After(newest.proc.Started())) {
			newest = in
		}
	}
	return newest
}

// instanceOf is the instance, in any fleet of the run, that ran proc; nil
// if none.
func (l *fleetLog) instanceOf(proc replicaProcess) *instance {
	for _, f := range l.list() {
		f.mu.Lock()
		for _, s := range f.slots {
			for _, in := range s.instances {
				if in.proc == proc {
					f.mu.Unlock()
					return in
				}
			}
		}
		f.mu.Unlock()
	}
	return nil
}

// containerStarted adds a new container of a StatefulSet's pod to the
// running fleet, at the slot of the pod's ordinal.
func (l *fleetLog) containerStarted(ordinal int, c *container) {
	if f := l.running(); f != nil {
		f.addContainer(ordinal, c)
	}
}
