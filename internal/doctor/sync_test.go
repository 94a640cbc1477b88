package doctor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// doctor reads the sync setting a server runs with from its monitoring
// port, and finds fault with anything but always.
func TestSyncOfTheServer(t *testing.T) {
	ctx := context.Background()
	always, _ := testenv.NATSWith(t, func(o *server.Options) { o.HTTPHost, o.HTTPPort = "127.0.0.1", -1 })
	s, err := doctor.SyncOf(ctx, "http://"+always.MonitorAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Always || s.String() != "always" {
		t.Errorf("a testenv server: %+v (%s), want always", s, s)
	}
	if fs := doctor.CheckSync("x", s); len(fs) != 0 {
		t.Errorf("always: findings %v", fs)
	}

	def, _ := testenv.NATSWith(t, func(o *server.Options) {
		o.HTTPHost, o.HTTPPort = "127.0.0.1", -1
		o.SyncAlways, o.SyncInterval = false, 0
	})
	s, err = doctor.SyncOf(ctx, "http://"+def.MonitorAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if s.Always || s.Interval != 2*time.Minute {
		t.Errorf("the server's default: %+v, want every 2m", s)
	}
	fs := doctor.CheckSync("nats://x", s)
	if len(fs) != 1 || fs[0].Rule != doctor.RuleNATSSync || !strings.Contains(fs[0].Reason, "2m0s (the default)") {
		t.Errorf("default: findings %v", fs)
	}

	if _, err := doctor.SyncOf(ctx, "http://127.0.0.1:1"); !errors.Is(err, doctor.ErrSyncUnknown) {
		t.Errorf("no monitoring port: %v, want ErrSyncUnknown", err)
	}
}
