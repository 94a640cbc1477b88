package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/internal/natssync"
)

// RuleNATSSync: the NATS server must fsync every message before its
// PubAck (sync_interval: always, internal/natssync): its default, an fsync
// every 2 minutes, loses acknowledged events on a power loss or OS crash
// of its host (NATS docs, "JetStream configuration"; Jepsen, NATS 2.12.1,
// December 2025).
const RuleNATSSync = "nats-sync"

// ErrSyncUnknown is returned by [SyncOf] when the server's setting cannot
// be read.
var ErrSyncUnknown = fmt.Errorf("doctor: the NATS server's sync setting is not known")

// SyncOf reads a NATS server's JetStream sync setting from its monitoring
// endpoint: GET <monitorURL>/varz, jetstream.config.sync_interval
// (nanoseconds) and sync_always (nats-server's JetStreamConfig). The
// client connection cannot tell: the setting is in $SYS's VARZ and JSZ,
// which only the system account may ask for, and tripsaga's identities
// are not in it. An error wraps [ErrSyncUnknown].
func SyncOf(ctx context.Context, monitorURL string) (natssync.Setting, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(monitorURL, "/")+"/varz", nil)
	if err != nil {
		return natssync.Setting{}, fmt.Errorf("%w: --nats-monitor %q: %w", ErrSyncUnknown, monitorURL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return natssync.Setting{}, fmt.Errorf("%w: %w", ErrSyncUnknown, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return natssync.Setting{}, fmt.Errorf("%w: GET %s/varz: %s", ErrSyncUnknown, monitorURL, resp.Status)
	}
	var v struct {
		JetStream struct {
			Config *struct {
				SyncInterval time.Duration `json:"sync_interval"`
				SyncAlways   bool          `json:"sync_always"`
			} `json:"config"`
		} `json:"jetstream"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return natssync.Setting{}, fmt.Errorf("%w: GET %s/varz: %w", ErrSyncUnknown, monitorURL, err)
	}
	if v.JetStream.Config == nil {
		return natssync.Setting{}, fmt.Errorf("%w: GET %s/varz has no jetstream.config (JetStream off?)", ErrSyncUnknown, monitorURL)
	}
	return natssync.Setting{Always: v.JetStream.Config.SyncAlways, Interval: v.JetStream.Config.SyncInterval}, nil
}

// CheckSync returns a [RuleNATSSync] finding for server when s is not
// natssync's policy.
func CheckSync(server string, s natssync.Setting) []Finding {
	if s.Always {
		return nil
	}
	return []Finding{{
		Rule: RuleNATSSync, Object: "NATS server " + server,
		Reason: fmt.Sprintf("sync_interval %s: %s", s, s.Risk()),
		Source: "NATS docs, JetStream configuration (sync_interval); Jepsen, NATS 2.12.1 (December 2025); issue 17",
	}}
}
