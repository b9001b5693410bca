package etcdsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attempts remembers why the attempts of one call failed. etcd's client
// retries a read on a broken connection until the call's deadline and then
// reports only the deadline; an operator needs the cause (an expired or
// untrusted certificate, a refused port), in the error the cache records
// and a binding's condition shows. One cause shows as several errors (the
// server's alert, then a broken pipe on the next try), so it keeps the
// first few distinct ones.
type attempts struct {
	mu     sync.Mutex
	causes []string
}

// maxCauses bounds what one call's error carries.
const maxCauses = 3

type attemptsKey struct{}

// withAttempts makes the calls under ctx record their attempts' failures,
// through the interceptor NewClient installs.
func withAttempts(ctx context.Context) (context.Context, *attempts) {
	a := &attempts{}
	return context.WithValue(ctx, attemptsKey{}, a), a
}

// explain adds the last attempt's failure to err when err says no more
// than that the call ran out of time.
func (a *attempts) explain(err error) error {
	if err == nil {
		return nil
	}
	a.mu.Lock()
	causes := strings.Join(a.causes, "; ")
	a.mu.Unlock()
	if causes == "" || !(errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w (attempts failed with: %s)", err, causes)
}

// recordAttempts is a unary interceptor under etcd's retrying one: it sees
// every attempt, and records a failed one's cause in the call's attempts.
func recordAttempts(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	// An attempt that waited for a connection until the deadline says why
	// there was none ("latest balancer error: …"); a plain deadline says
	// nothing more than the call's own error will.
	if a, ok := ctx.Value(attemptsKey{}).(*attempts); ok && err != nil && status.Convert(err).Message() != context.DeadlineExceeded.Error() && status.Code(err) != codes.Canceled {
		msg := strings.TrimPrefix(status.Convert(err).Message(), "latest balancer error: ")
		a.mu.Lock()
		if len(a.causes) < maxCauses && !slices.Contains(a.causes, msg) {
			a.causes = append(a.causes, msg)
		}
		a.mu.Unlock()
	}
	return err
}
