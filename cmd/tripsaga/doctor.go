package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

func doctorCmd() *cobra.Command {
	var asJSON bool
	var dir, monitor string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the live JetStream configuration against the rules the guarantees rest on; exit non-zero on any violation",
		Long: `doctor reads the live configuration from NATS (every event stream, its
consumers, the cluster size) and checks it, with the settings every service
runs with, against the rules the guarantees rest on. Each violation is
printed with its reason and where the rule comes from:

  relay-backoff        the relay's longest backoff (or LocalGrace) not below
                       half of a stream's duplicate window
  ack-wait-short       an inbox consumer's AckWait not longer than the
                       slowest handler
  ack-wait-default     a durable consumer's AckWait left to the server's 30 s
  max-deliver-default  a durable consumer's MaxDeliver left unlimited (only a
                       tripsaga inbox, which parks at delivery 25 itself,
                       may have -1)
  max-deliver-server   an inbox consumer with a server MaxDeliver (drops
                       events without a trace)
  stream-retention     a work-queue or interest stream
  stream-storage       a memory stream
  stream-max-age       a max age shorter than the longest replay (30 days),
                       or longer than the inbox keeps its rows
  stream-replicas      replicas above the cluster size (live, or asked for
                       by STREAM_REPLICAS)
  stream-missing       an event stream that does not exist yet
  nats-sync            a server that does not fsync every message before its
                       PubAck (sync_interval: always): its default, every
                       2 minutes, loses acknowledged events on a power loss
                       (read from its monitoring port, --nats-monitor; the
                       client connection cannot see it, only the system
                       account can, so without the flag it is reported as
                       not known)

Every service runs the same check at start and refuses to start on a
violation; a missing stream is then no violation: the service creates its
own and waits for the others' (tripsaga streams apply creates them all).

It reaches NATS by NATS_URL or, with --dir D, through the "tripsaga up
--dir D" running there (D/up.env); with neither, through an up running in
the default folder .tripsaga.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true, // a violation is no usage error
		SilenceErrors: true, // main prints it
		RunE: func(cmd *cobra.Command, _ []string) error {
			env, err := envForTool(dir, "NATS_URL")
			if err != nil {
				return fmt.Errorf("doctor: %w", err)
			}
			nc, err := process.ConnectNATS(env, natsauth.Admin, nats.Name("tripsaga-doctor"), nats.Timeout(5*time.Second))
			if err != nil {
				return fmt.Errorf("doctor: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return fmt.Errorf("doctor: jetstream: %w", err)
			}
			cfg := doctor.DefaultConfig(env.Steps())
			cfg.RequireStreams = true
			cfg.StreamReplicas = max(env.StreamReplicas, 1) // STREAM_REPLICAS, as the services read it
			fs, err := doctor.Check(cmd.Context(), nc, js, cfg)
			if err != nil {
				return err
			}
			syncLine := "NATS store sync: not known over the client connection (only the system account may read it); give the server's monitoring URL with --nats-monitor (compose: http://localhost:8222). Servers tripsaga starts sync always (internal/natssync)"
			if monitor != "" {
				st, err := doctor.SyncOf(cmd.Context(), monitor)
				if err != nil {
					return err
				}
				syncLine = fmt.Sprintf("NATS store sync: %s: %s", st, st.Risk())
				fs = append(fs, doctor.CheckSync(monitor, st)...)
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if fs == nil {
					fs = []doctor.Finding{}
				}
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(fs); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(w, syncLine)
				printFindings(w, env.NATSURL, fs)
			}
			if len(fs) > 0 {
				return fmt.Errorf("doctor: %d violations", len(fs))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings as a JSON array (empty when all is well)")
	cmd.Flags().StringVar(&monitor, "nats-monitor", os.Getenv("NATS_MONITOR_URL"), "the NATS server's monitoring `URL` (its /varz says its sync setting; default $NATS_MONITOR_URL)")
	cmd.Flags().StringVar(&dir, "dir", "", "use the tripsaga up running in this `folder` (its up.env) instead of NATS_URL")
	return cmd
}

func printFindings(w io.Writer, url string, fs []doctor.Finding) {
	if len(fs) == 0 {
		fmt.Fprintf(w, "ok: the configuration on %s keeps every guarantee\n", url)
		return
	}
	fmt.Fprintf(w, "%d violations on %s:\n", len(fs), url)
	for _, f := range fs {
		fmt.Fprintf(w, "\n%s  [%s]\n  %s\n  rule from: %s\n", f.Object, f.Rule, f.Reason, f.Source)
	}
}
