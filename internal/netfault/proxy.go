// Package netfault puts a fault on the wire between one client and its
// server: a TCP proxy on loopback that can delay what the client sends,
// hold both ways for a while (a partition) and then heal, or cut the
// connections open now.
//
// It exists for the fault that a process-local fence cannot stop: a request
// already sent when the network stalls, delivered after the sender's Lease
// has moved to another replica (a network that heals late, a pause with a
// request in the socket). The client's own check ran before the request
// left; only the API server can refuse it when it finally arrives. The proxy
// copies bytes and never reads them, so TLS passes through unchanged.
package netfault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback address to a target, and
// delays the client-to-server bytes while a delay is in force, and the
// bytes of both sides while a partition is.
type Proxy struct {
	ln     net.Listener
	target string

	mu sync.Mutex
	// delayUntil and delay: bytes a client sends before delayUntil reach
	// the server delay after they were sent.
	delayUntil time.Time
	delay      time.Duration
	// healAt: bytes either side sends before healAt are delivered at
	// healAt.
	healAt time.Time
	// latency is added to every client-to-server byte (SetLatency).
	latency time.Duration
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
	// delayed counts the chunks that were held back, either way.
	delayed int
}

// Listen starts a proxy on a free loopback port that forwards to target
// ("host:port").
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the proxy to %s: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, "127.0.0.1:port": give it to the client in
// place of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Delay makes every byte a client sends during the next d reach the server d
// after it was sent, in order: a request sent now arrives d late, and what
// is sent after it queues behind it. Responses are not delayed.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.delayUntil = d, time.Now().Add(d)
}

// SetLatency makes every byte a client sends from now on reach the server d
// after it was sent, in order, until it is set again: a network's one-way
// latency on every request, where Delay is a stall of a while. Requests
// multiplexed on one connection (gRPC) each arrive d late without queueing
// behind one another's latency.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Partition holds every byte either side sends during the next d until d
// has passed, then delivers it, in order: a network that drops both ways
// and heals with the connections still open, as TCP's retransmissions
// would deliver what was lost. The client's writes arrive after its Leases
// expired, and it hears nothing meanwhile, not even that they did.
func (p *Proxy) Partition(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.healAt = time.Now().Add(d)
}

// Cut closes every connection open now, both ways, as a middlebox that
// drops its flows would (a load balancer's idle timeout, a restarted
// proxy): the client sees its stream end mid-way. The proxy keeps
// accepting, so the client can connect again. It returns how many
// connections it cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2 // a client's and its server's side
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
	return n
}

// Delayed returns how many chunks were held back so far, either way.
func (p *Proxy) Delayed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delayed
}

// toServerAt returns when a chunk the client sent at t may be written to
// the server.
func (p *Proxy) toServerAt(t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := t
	if t.Before(p.delayUntil) {
		at = t.Add(p.delay)
	}
	if t.Before(p.healAt) && at.Before(p.healAt) {
		at = p.healAt
	}
	if at != t {
		p.delayed++
	}
	return at.Add(p.latency)
}

// toClientAt returns when a chunk the server sent at t may be written to
// the client.
func (p *Proxy) toClientAt(t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.Before(p.healAt) {
		p.delayed++
		return p.healAt
	}
	return t
}

// Close stops accepting, closes every connection and waits for the copies
// to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			forward(server, client, p.toServerAt)
		}()
		go func() {
			defer p.wg.Done()
			forward(client, server, p.toClientAt)
		}()
	}
}

// chunk is bytes read from one side and when they may be delivered.
type chunk struct {
	b  []byte
	at time.Time
}

// forward copies src to dst, each chunk at its delivery time (deliverAt of
// when it was read), in order. Reading never waits for delivery, so a held
// chunk does not stop the sender from sending more (as a network that holds
// packets would not); the queue is bounded by what a test sends in one
// fault.
func forward(dst, src net.Conn, deliverAt func(time.Time) time.Time) {
	queue := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range queue {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range queue {
				}
				return
			}
		}
		_ = dst.Close()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			queue <- chunk{b: append([]byte(nil), buf[:n]...), at: deliverAt(time.Now())}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = dst.Close()
			}
			break
		}
	}
	close(queue)
	<-done
}
