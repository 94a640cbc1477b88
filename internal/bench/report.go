package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText prints the report as tables, every figure with its ratio to the
// run's baselines where one applies. It never prints Go map syntax.
func (rep *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("tripsaga bench, %s, %.0f s\n", rep.Started.Format("2006-01-02 15:04 UTC"), rep.DurationS)
	m := rep.Machine
	p("machine: %d CPUs (%s), %.1f GB, Linux %s, %s, NATS server %s, load average at start %s\n",
		m.CPUs, m.CPUModel, m.MemoryGB, m.Kernel, m.GoVersion, m.NATS, m.LoadAvg)
	if rep.Mode == "external" {
		p("system: external (--trips-url); baselines, per-trip costs, the hop-by-hop table, relay and rebuild are not measured\n")
	} else {
		var ss []string
		for _, s := range rep.Postgres {
			ss = append(ss, s.Name+"="+s.Value)
		}
		p("PostgreSQL: %s\n", strings.Join(ss, " "))
		p("company simulators' records: %s\n", rep.SimStore)
		p("NATS: %s\n", rep.NATSNote)
		p("\nBASELINES (same cluster, same NATS server, this run)\n")
		p("  A  saga-step transactions/s (inbox insert + row update + outbox insert + commit, 16 connections)  %s\n", num(rep.SagaStepTPS))
		p("  B  JetStream async publishes/s (512 B, file stream)                                             %s\n", num(rep.JSPublishPerS))
	}
	p("\nTRIPS\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RUN\tTRIPS\tOFFERED/S\tACHIEVED/S\tA ÷ ACHIEVED\tP50 MS\tP95 MS\tP99 MS\tMAX MS\tANSWERS\tERRORS\tSETTLED")
	row := func(r LoadRun) {
		name, offered := fmt.Sprintf("closed, %d clients", r.Clients), "-"
		if r.Mode == "open" {
			name, offered = fmt.Sprintf("open, %d %% of max", r.OfferedPercent), num(r.OfferedPerS)
		}
		ratio := "-"
		if rep.SagaStepTPS > 0 && r.AchievedPerS > 0 {
			ratio = fmt.Sprintf("%.1f", rep.SagaStepTPS/r.AchievedPerS)
		}
		settled := "yes"
		if !r.Settled {
			settled = "NO: " + r.SettledNote
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\n", name, r.Trips, offered, num(r.AchievedPerS), ratio,
			r.Answer.P50, r.Answer.P95, r.Answer.P99, r.Answer.Max, FormatCounts(r.Answers), FormatCounts(r.Errors), settled)
	}
	for _, r := range rep.ClosedLoop {
		row(r)
	}
	for _, r := range rep.OpenLoop {
		row(r)
	}
	_ = tw.Flush()
	p("  max sustained: %s trips/s (best closed loop; %d warm-up trips before, not measured)\n", num(rep.TripsPerS), rep.WarmupTrips)
	if rep.Mode == "full" {
		p("\nPER TRIP (best closed loop; the window includes settling and idle polling)\n")
		p("  PostgreSQL transactions  %.1f   (idle: %.1f tx/s)\n", rep.PGTransactionsPerTrip, rep.PGIdleTransactionsPerS)
		p("  PostgreSQL statements    %.1f   (%.1f without BEGIN/COMMIT; pg_stat_statements does not count a BEGIN or COMMIT pipelined with other statements)\n", rep.PGStatementsPerTrip, rep.PGStatementsPerTripNoTxControl)
		p("  CPU ms per trip, total   %.2f\n", rep.CPUMSPerTrip)
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "    PROCESS\tMS/TRIP\tIDLE MS/S")
		for _, c := range rep.CPU {
			fmt.Fprintf(tw, "    %s\t%.2f\t%.1f\n", c.Process, c.MSPerTrip, c.IdleMSPerS)
		}
		_ = tw.Flush()
		p("  reconciler lag (event made → applied): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", rep.ReconcilerLag.P50, rep.ReconcilerLag.P99, rep.ReconcilerLag.Max)
		if len(rep.TopStatements) > 0 {
			p("  most called statements (calls per trip, exec ms per trip):\n")
			for _, s := range rep.TopStatements {
				p("    %6.2f  %7.3f  %s\n", s.CallsPerTrip, s.TotalMSPerTrip, s.Query)
			}
		}
		if h := rep.Hops; h != nil && h.Trips > 0 {
			p("\nONE TRIP, HOP BY HOP (closed loop of %s, %d trips; each transaction's start and each event's store in its stream)\n", plural(h.Clients, "client"), h.Trips)
			tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  FROM\tTO\tP50 MS\tP95 MS\tWHAT")
			for _, x := range h.Hops {
				fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%.2f\t%s\n", x.From, x.To, x.P50, x.P95, x.What)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%.2f\t%s\n", h.Hops[0].From, h.Hops[len(h.Hops)-1].To, h.Total.P50, h.Total.P95, "the whole path (the client also waits for the POST's reading, the last commit and the answer)")
			_ = tw.Flush()
		}
		r := rep.Relay
		p("\nOUTBOX RELAY (outbox.Write + one Relay.PublishBatch loop, scratch schema, scratch NATS)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  draining a %s-event backlog\t%s events/s\n", num(float64(r.Backlog)), num(r.DrainPerS))
		fmt.Fprintf(tw, "  draining a second one, %d writers running\t%s events/s over %.1f s (writers meanwhile: %s events/s, one event per transaction)\n", r.Writers, num(r.WithWritersPerS), r.WithWritersS, num(r.WritersPerS))
		fmt.Fprintf(tw, "  writing a backlog (100 events per transaction, 4 writers)\t%s events/s\n", num(r.WritePerS))
		_ = tw.Flush()
		if sr := rep.Sync; sr != nil {
			p("\nSTORE SYNC AND OUTBOX VERIFY (two scratch NATS servers on one disk: sync always, the policy, and nats-server's default, every 2 min)\n")
			tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "  async publishes of 512 B, 3 s\t%s/s always\t%s/s default\n", num(sr.PublishAlwaysPerS), num(sr.PublishDefaultPerS))
			fmt.Fprintf(tw, "  relay draining %s events\t%s events/s always\t%s events/s default\n", num(float64(sr.Events)), num(sr.RelayAlwaysPerS), num(sr.RelayDefaultPerS))
			fmt.Fprintf(tw, "  the same, verify passes back to back (%d)\t%s events/s always\t\n", sr.VerifyPasses, num(sr.RelayVerifyingPerS))
			fmt.Fprintf(tw, "  one full verify pass, every row read back\t%s rows/s\t\n", num(sr.VerifyReadBackPerS))
			_ = tw.Flush()
		}
		p("\nRECONCILER REBUILD (reconciler.Replay, scratch schema, scratch NATS)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, x := range rep.Rebuild {
			fmt.Fprintf(tw, "  %s events (%s trips)\t%.2f s\t%s events/s\n", num(float64(x.Events)), num(float64(x.Trips)), x.DurationS, num(x.EventsPerS))
		}
		_ = tw.Flush()
		lin := "yes"
		if !rep.RebuildLinear {
			lin = "NO"
		}
		p("  2n ÷ n time: %.2f (linear enough, ≤ 2.2: %s)\n", rep.RebuildTimeRatio, lin)
	}
	if len(rep.Scaling) > 0 {
		p("\nSCALING (the system started afresh for each point on the same cluster; closed loop of the best run's clients, open loop at half the point's trips/s)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  REPLICAS\tNATS NODES\tCLIENTS\tTRIPS/S\t÷ 1 REPLICA\tP50 MS\tP99 MS\tOPEN 50 % P99 MS\tCPU MS/TRIP\tSETTLED")
		one := map[int]float64{}
		for _, x := range rep.Scaling {
			if x.Replicas == 1 {
				one[x.NATSNodes] = x.TripsPerS
			}
		}
		for _, x := range rep.Scaling {
			rel := "-"
			if one[x.NATSNodes] > 0 {
				rel = fmt.Sprintf("%.2f", x.TripsPerS/one[x.NATSNodes])
			}
			settled := "yes"
			if !x.Settled {
				settled = "NO: " + x.Note
			}
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\n", x.Replicas, x.NATSNodes, x.Clients, num(x.TripsPerS), rel,
				num(x.AnswerP50MS), num(x.AnswerP99MS), num(x.OpenP99MS), x.CPUMSPerTrip, settled)
		}
		_ = tw.Flush()
	}
	if pr := rep.Peer; pr != nil {
		p("\nPEER: %s (%s, bench/peers/%s), measured after ours in the same run: alone on the same cluster (database %s), company simulators of the same code in their own process, the same warm-up (%d trips) and closed loops\n",
			pr.Name, pr.Library, pr.Name, peerDB, pr.WarmupTrips)
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  FIGURE\tTRIPSAGA\t%s\tTRIPSAGA ÷ %s\n", strings.ToUpper(pr.Name), strings.ToUpper(pr.Name))
		for _, r := range rep.sideBySide() {
			ratio := "-"
			if r.Ratio > 0 {
				ratio = num(r.Ratio)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r.Figure, num(r.Ours), num(r.Peer), ratio)
		}
		_ = tw.Flush()
		var cs []string
		for _, c := range pr.CPU {
			cs = append(cs, fmt.Sprintf("%s %.2f", c.Process, c.MSPerTrip))
		}
		p("  %s's CPU ms per trip by process: %s\n", pr.Name, strings.Join(cs, ", "))
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  PEER RUN\tTRIPS\tACHIEVED/S\tP50 MS\tP95 MS\tP99 MS\tMAX MS\tANSWERS\tERRORS\tSETTLED")
		for _, r := range pr.ClosedLoop {
			settled := "yes"
			if !r.Settled {
				settled = "NO: " + r.SettledNote
			}
			fmt.Fprintf(tw, "  closed, %d clients\t%d\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\n", r.Clients, r.Trips, num(r.AchievedPerS),
				r.Answer.P50, r.Answer.P95, r.Answer.P99, r.Answer.Max, FormatCounts(r.Answers), FormatCounts(r.Errors), settled)
		}
		_ = tw.Flush()
		for _, r := range pr.Rejections {
			p("  rejected on purpose, %s: %d of %d trips canceled with that reason (answers: %s)\n", r.Kind, r.Canceled, r.Trips, FormatCounts(r.Answers))
		}
		a := pr.Audit
		p("  audit against the companies' records: %d trips, %d whole, %d empty, %d neither or doubled\n", a.Trips, a.Whole, a.Empty, a.Bad)
		for _, x := range a.Problems {
			p("    %s\n", x)
		}
		for _, n := range pr.Notes {
			p("  note: %s\n", n)
		}
	}
	if len(rep.Ratios) > 0 {
		p("\nRATIOS AND TARGETS (this run)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, r := range rep.Ratios {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.Name, num(r.Value), r.Target)
		}
		_ = tw.Flush()
	}
	for _, n := range rep.Notes {
		p("note: %s\n", n)
	}
	if rep.Settled {
		p("\nevery trip confirmed; nothing pending after any run\n")
	} else {
		p("\nNOT SETTLED: some trip was not confirmed or was left pending (see SETTLED)\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// num prints a figure with thousands separators and at most 2 decimals.
func num(v float64) string {
	neg := v < 0
	if neg {
		v = -v
	}
	var s string
	switch {
	case v >= 100:
		s = fmt.Sprintf("%.0f", v)
	case v >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	intPart, frac, _ := strings.Cut(s, ".")
	var out []byte
	for i := range len(intPart) {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, intPart[i])
	}
	s = string(out)
	if frac != "" {
		s += "." + frac
	}
	if neg {
		s = "-" + s
	}
	return s
}

// plural is "1 client" or "n clients".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
