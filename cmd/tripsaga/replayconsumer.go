package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/replay"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler"
)

// replayFlags are replay's flags for a consumer's replay and the shadow.
type replayFlags struct {
	fromSeq           uint64
	since             string
	stream, trip, typ string
	dryRun            bool
	shadow, switchTo  bool
	operator, reason  string
	progress          bool
}

func (f *replayFlags) register(cmd *cobra.Command) {
	cmd.Flags().Uint64Var(&f.fromSeq, "from-seq", 0, "re-drive the consumer from exactly this stream sequence to the end (refused, with nothing moved, when the stream no longer holds it, ends before it, or the consumer starts after it)")
	cmd.Flags().StringVar(&f.since, "since", "", "re-drive the consumer from this time (RFC 3339, or a duration ago: 10m)")
	cmd.Flags().StringVar(&f.stream, "stream", "", "only this stream of the consumer (TRIPS, HOTEL, PAYMENT, CAR, OPERATOR)")
	cmd.Flags().StringVar(&f.trip, "trip", "", "only the events of this trip")
	cmd.Flags().StringVar(&f.typ, "type", "", "only events of this type (io.tripsaga.hotel.held.v1 or hotel.held)")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "print what would be delivered and change nothing")
	cmd.Flags().BoolVar(&f.shadow, "shadow", false, "reconciler: rebuild into trip_view_shadow and print the differences from the live view")
	cmd.Flags().BoolVar(&f.switchTo, "switch", false, "with --shadow: then rebuild the live view too")
	cmd.Flags().StringVar(&f.operator, "operator", os.Getenv("USER"), "who replays (recorded with a filtered replay's actions)")
	cmd.Flags().StringVar(&f.reason, "reason", "", "why (recorded with a filtered replay's actions)")
	cmd.Flags().BoolVar(&f.progress, "progress", true, "show a progress bar on stderr")
}

// consumerReplay reports whether the flags ask for a consumer's replay.
func (f replayFlags) consumerReplay() bool {
	return f.fromSeq != 0 || f.since != "" || f.dryRun || f.trip != "" || f.typ != "" || f.stream != ""
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-11-30T14:00:00Z) or a duration ago (10m)", s)
}

func runConsumerReplay(cmd *cobra.Command, dir, consumer string, f replayFlags, asJSON bool) error {
	if f.shadow || f.switchTo {
		return errors.New("--shadow rebuilds the reconciler's whole view; it takes no --from-seq, --since or filters")
	}
	var since time.Time
	if f.since != "" {
		var err error
		if since, err = parseSince(f.since, time.Now()); err != nil {
			return err
		}
	}
	env, err := envForTool(dir, "NATS_URL")
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	nc, err := process.ConnectNATS(env, natsauth.Admin, nats.Name("tripsaga-replay"))
	if err != nil {
		return fmt.Errorf("replay: NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var bar io.Writer
	if f.progress {
		bar = cmd.ErrOrStderr()
	}
	w := cmd.OutOrStdout()
	var lines io.Writer = io.Discard
	var tw *tabwriter.Writer
	if f.dryRun && !asJSON {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "STREAM\tSEQ\tSTORED\tTYPE\tTRIP\tEVENT ID")
		lines = tw
	}
	cat := env.Steps()
	res, err := replay.Run(cmd.Context(), replay.Config{
		JetStream: js, Catalogue: &cat, Consumer: consumer, Stream: f.stream, FromSeq: f.fromSeq, Since: since,
		Trip: f.trip, Type: f.typ, DryRun: f.dryRun, Operator: f.operator, Reason: f.reason,
		Out: lines, Progress: bar,
	})
	if tw != nil {
		_ = tw.Flush()
	}
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			replay.Result
			EventsPerSecond float64 `json:"events_per_second"`
		}{res, res.EventsPerSecond()})
	}
	verb := map[string]string{"reset": "re-delivered to", "redrive": "handed to", "dry-run": "would be delivered to"}[res.Mode]
	fmt.Fprintf(w, "%d events %s %s in %s (%.0f events/s)\n", res.Events, verb, consumer, res.Duration.Round(time.Millisecond), res.EventsPerSecond())
	for _, s := range res.Streams {
		if s.NoConsumer {
			fmt.Fprintf(w, "  %-8s no durable consumer of %s (it reads these events in its own transactions)\n", s.Stream, consumer)
			continue
		}
		if s.From == 0 {
			fmt.Fprintf(w, "  %-8s nothing stored from there\n", s.Stream)
			continue
		}
		fmt.Fprintf(w, "  %-8s #%d..#%d: %d events\n", s.Stream, s.From, s.To, s.Events)
	}
	if res.Mode == "reset" {
		fmt.Fprintf(w, "its inbox dropped the events it had handled already; see tripsaga_inbox_events_total{consumer=%q,outcome=\"duplicate\"}\n", consumer)
	}
	return nil
}

func runShadowReplay(cmd *cobra.Command, dir, name string, f replayFlags, asJSON bool) error {
	if name != reconciler.ProjectionName {
		return fmt.Errorf("--shadow: only the %s projection has a shadow", reconciler.ProjectionName)
	}
	if f.switchTo && !f.shadow {
		return errors.New("--switch goes with --shadow: look at the differences first")
	}
	p, log, err := openReplay(cmd, dir)
	if err != nil {
		return err
	}
	defer p.Close()
	var bar *progressbar.ProgressBar
	if f.progress {
		bar = replay.NewBar(cmd.ErrOrStderr(), "shadow rebuild")
	}
	cfg := reconciler.ReplayConfig{Pool: p.Pool, JetStream: p.JS, Catalogue: p.Env.Steps(), Logger: log}
	st, err := reconciler.ReplayShadow(cmd.Context(), cfg, func(n int) {
		if bar != nil {
			_ = bar.Set(n)
		}
	})
	if bar != nil {
		_ = bar.Finish()
	}
	if err != nil {
		return fmt.Errorf("replay --shadow: %w", err)
	}
	w := cmd.OutOrStdout()
	var switched *reconciler.ReplayStats
	if f.switchTo {
		rs, err := reconciler.Replay(cmd.Context(), cfg)
		if err != nil {
			return fmt.Errorf("replay --switch: %w", err)
		}
		switched = &rs
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"shadow": st, "events_per_second": st.EventsPerSecond(), "switched": switched})
	}
	fmt.Fprintf(w, "shadow of %s: %d events read (%d distinct applied, %d skipped) into %d trips in %s (%.0f events/s)\n",
		name, st.Events, st.Applied, st.Skipped, st.Trips, st.Duration.Round(time.Millisecond), st.EventsPerSecond())
	if len(st.Diffs) == 0 {
		fmt.Fprintln(w, "no difference from the live view")
	} else {
		fmt.Fprintf(w, "%d trips differ from the live view:\n", len(st.Diffs))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TRIP\tLIVE STATUS\tSHADOW STATUS\tLIVE EVENTS\tSHADOW EVENTS\tLIVE SEEN\tSHADOW SEEN\tTIMES")
		for _, d := range st.Diffs {
			times := "same"
			if d.TimesDiffer {
				times = "differ"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.TripID, dash(d.LiveStatus), dash(d.ShadowStatus), max(d.LiveEvents, 0),
				max(d.ShadowEvents, 0), dash(d.LiveSeen), dash(d.ShadowSeen), times)
		}
		_ = tw.Flush()
	}
	if switched != nil {
		fmt.Fprintf(w, "switched: the live view was rebuilt from the streams under its locks (%d events into %d trips, %.0f events/s)\n",
			switched.Events, switched.Trips, switched.EventsPerSecond())
	} else if len(st.Diffs) > 0 {
		fmt.Fprintln(w, "the live view is unchanged; run again with --switch to rebuild it")
	}
	return nil
}
