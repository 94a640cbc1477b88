package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

// streamsCmd is `tripsaga streams`: the JetStream streams of the catalogue.
func streamsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "streams",
		Short: "The JetStream streams of the event catalogue (apply: create or update them all)",
	}
	cmd.AddCommand(streamsApplyCmd())
	return cmd
}

func streamsApplyCmd() *cobra.Command {
	var (
		dir    string
		asJSON bool
		wait   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Create or update every stream of the catalogue, as the admin identity; idempotent",
		Long: `apply creates or updates every event stream of the catalogue (with STEPS,
the catalogue it orders) and the dead-letter stream, with the settings the
guarantees rest on (limits retention, file storage, a 2-minute duplicate
window, 30 days' max age) and STREAM_REPLICAS replicas (an existing stream
with more keeps them), and prints what it did to each: created, updated
(its configuration differed) or unchanged. Run again, every stream is
unchanged.

Each service creates its own streams at start and again when they are
lost, and waits for (and consumes once they appear) the streams of others,
so processes may start in any order. A deployment that bootstraps
explicitly runs this once before the services (compose does).

It connects as the admin identity, which alone may create every stream
(NATS_CREDS, or NATS_NKEY when NATS_CREDS is unset; natsauth), to
NATS_URL or, with --dir D, to the "tripsaga up --dir D" running there. It
waits up to --wait for JetStream to answer (a server just started, a
cluster electing its meta leader).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait <= 0 {
				return fmt.Errorf("streams apply: --wait %s: want a positive duration", wait)
			}
			env, err := envForTool(dir, "NATS_URL")
			if err != nil {
				return fmt.Errorf("streams apply: %w", err)
			}
			nc, err := process.ConnectNATS(env, natsauth.Admin, nats.Name("tripsaga-streams"), nats.Timeout(5*time.Second),
				nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
			if err != nil {
				return fmt.Errorf("streams apply: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return fmt.Errorf("streams apply: jetstream: %w", err)
			}
			changes, err := applyStreams(cmd.Context(), js, max(env.StreamReplicas, 1), wait)
			if err != nil {
				return fmt.Errorf("streams apply on %s: %w", env.NATSURL, err)
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(changes)
			}
			printStreamChanges(w, env.NATSURL, changes)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "use the tripsaga up running in this `folder` (its up.env) instead of NATS_URL")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was done as a JSON array, one object per stream")
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "how long to wait for JetStream to answer and the streams to be made")
	return cmd
}

// applyStreams waits for JetStream and applies the catalogue's streams,
// trying again until wait ends: in a cluster a stream being created may
// time out until its group has a leader.
func applyStreams(ctx context.Context, js jetstream.JetStream, replicas int, wait time.Duration) ([]events.StreamChange, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := process.WaitJetStream(ctx, js, wait); err != nil {
		return nil, err
	}
	for {
		changes, err := events.ApplyStreams(ctx, js, events.Selected(), replicas)
		if err == nil {
			return changes, nil
		}
		select {
		case <-ctx.Done():
			return changes, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func printStreamChanges(w io.Writer, url string, changes []events.StreamChange) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tDONE\tSUBJECTS\tREPLICAS\tOWNER")
	count := map[string]int{}
	for _, c := range changes {
		owner := c.Owner
		if owner == "" {
			owner = "(every consumer)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", c.Stream, c.Action, strings.Join(c.Subjects, ","), c.Replicas, owner)
		count[c.Action]++
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d streams on %s: %d created, %d updated, %d unchanged\n", len(changes), url,
		count[events.StreamCreated], count[events.StreamUpdated], count[events.StreamUnchanged])
}
