package routing

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tenure-go/tenure/coordinator"
)

// EventSource is the coordinator's event subscription;
// *coordinator.Coordinator implements it.
type EventSource interface {
	Subscribe(buf int) (<-chan coordinator.Event, func())
}

// Health is gRPC's standard health service (grpc.health.v1.Health) tied to
// a coordinator: it answers SERVING until the node starts a graceful Leave
// (coordinator.EventLeaving) or its coordinator closes, and NOT_SERVING
// for every service from then on, so load balancers and orchestrators stop
// sending it calls before its partitions move.
//
// The embedded *health.Server may also be set by hand (SetServingStatus),
// until the node leaves. Close stops following the coordinator.
type Health struct {
	*health.Server
	cancel func()
	once   sync.Once
	quit   chan struct{}
	done   chan struct{}
}

const healthEventBuffer = 1024

// NewHealth returns a health service following src, reporting SERVING for
// the whole server ("") and for each of services.
func NewHealth(src EventSource, services ...string) *Health {
	h := &Health{
		Server: health.NewServer(),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for _, s := range services {
		h.SetServingStatus(s, healthgrpc.HealthCheckResponse_SERVING)
	}
	// Room for a burst of ownership events, so EventLeaving is not dropped
	// behind them (the coordinator drops events for full subscribers).
	events, cancel := src.Subscribe(healthEventBuffer)
	h.cancel = cancel
	go h.follow(events)
	return h
}

func (h *Health) follow(events <-chan coordinator.Event) {
	defer close(h.done)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				select {
				case <-h.quit: // our own Close
				default: // the coordinator closed
					h.Shutdown()
				}
				return
			}
			if ev.Kind == coordinator.EventLeaving {
				h.Shutdown()
			}
		case <-h.quit:
			return
		}
	}
}

// Register registers the health service on s.
func (h *Health) Register(s grpc.ServiceRegistrar) {
	healthgrpc.RegisterHealthServer(s, h.Server)
}

// Close stops following the coordinator; the status stays as it is. It
// is idempotent, safe for concurrent use, and returns once the follower goroutine has ended.
func (h *Health) Close() {
	h.once.Do(func() {
		close(h.quit)
		h.cancel()
	})
	<-h.done
}
