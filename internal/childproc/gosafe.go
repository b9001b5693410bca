package childproc

import (
	"context"
	"fmt"
	"runtime/debug"
)

// GoSafe runs fn in a goroutine beside the children until the returned stop
// is called. A panic in fn cancels the run with the panic as the cause
// instead of killing the process, so the deferred cleanup still stops
// every child.
func GoSafe(ctx context.Context, cancel context.CancelCauseFunc, what string, fn func(context.Context)) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				cancel(fmt.Errorf("%s panicked: %v\n%s", what, p, debug.Stack()))
			}
		}()
		fn(ctx)
	}()
	return func() { stopCtx(); <-done }
}
