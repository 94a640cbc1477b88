package chaos

import (
	"strconv"

	"github.com/tripsaga/tripsaga/sim"
)

// Fault is one probabilistic fault rule armed on one company for the
// length of the run (sim.Rule.Chance, the simulators' test extension).
type Fault struct {
	// Company is the variable naming its base URL: HOTEL_URL,
	// PAYMENTS_URL, CARS_URL, MAIL_URL or INSURER_URL.
	Company string   `json:"company"`
	Rule    sim.Rule `json:"rule"`
}

// Name says the fault in a few words: "hotel hold fail 5%".
func (f Fault) Name() string {
	n := companyName(f.Company) + " " + f.Rule.Op + " " + f.Rule.Fault
	if f.Rule.DelayMS > 0 {
		n += " " + strconv.Itoa(f.Rule.DelayMS) + "ms"
	}
	return n
}

func companyName(envName string) string {
	switch envName {
	case "HOTEL_URL":
		return "hotel"
	case "PAYMENTS_URL":
		return "payments"
	case "CARS_URL":
		return "cars"
	case "MAIL_URL":
		return "mail"
	case "INSURER_URL":
		return "insurer"
	}
	return envName
}

// DefaultFaults are the faults `tripsaga chaos` arms: for every forward
// call (hold, charge, book) 503s, lost answers, hangs, late commits and
// slow answers (some slower than the services' 2 s call timeout); for
// every undo (release, refund, cancel) 503s, lost answers and slow
// answers; for the mail relay the same as a forward call. Each applies to
// a call with its Chance, independently, in this order; a call draws
// about one fault in four (one in three for an undo). The waits stay
// shorter than the services' step deadline (8 s), so a late commit lands
// while the step still asks by key; one that lands after an undo by key
// is the verification's (saga.Timing.VerifyAfter) to find and undo.
//
// Business answers (sold out, declined) are not drawn here: the run's mix
// of travelers asks for them (see [Config.Mix]). Faults that raise an
// incident for a person by design (refuse, unauthorized, wrong_key,
// wrong_amount) are left out: a run with them cannot settle by itself.
func DefaultFaults() []Fault {
	var out []Fault
	out = append(out, forwardFaults("HOTEL_URL", sim.OpHold)...)
	out = append(out, undoFaults("HOTEL_URL", sim.OpRelease)...)
	out = append(out, forwardFaults("PAYMENTS_URL", sim.OpCharge)...)
	out = append(out, undoFaults("PAYMENTS_URL", sim.OpRefund)...)
	out = append(out, forwardFaults("CARS_URL", sim.OpBook)...)
	out = append(out, undoFaults("CARS_URL", sim.OpCancel)...)
	out = append(out, forwardFaults("MAIL_URL", sim.OpMessage)...)
	return out
}

// InsurerFaults are the faults a run arms on the insurer when the
// optional insurance step is on (added to [DefaultFaults] when
// Config.Faults is nil): its policy bought (POST /policies) draws what
// every forward call draws, its cancel (POST /policies/{key}/cancel, the
// compensation and the undo by key at the deadline) what every undo draws.
func InsurerFaults() []Fault {
	return append(forwardFaults("INSURER_URL", sim.OpInsure), undoFaults("INSURER_URL", sim.OpVoid)...)
}

// forwardFaults are a forward call's faults (see [DefaultFaults]).
func forwardFaults(company, op string) []Fault {
	return []Fault{
		{company, sim.Rule{Op: op, Fault: sim.FaultFail, Chance: 0.05}},
		{company, sim.Rule{Op: op, Fault: sim.FaultLoseAnswer, Chance: 0.05}},
		{company, sim.Rule{Op: op, Fault: sim.FaultHang, DelayMS: 5000, Chance: 0.02}},
		{company, sim.Rule{Op: op, Fault: sim.FaultCommitLate, DelayMS: 3000, Chance: 0.03}},
		{company, sim.Rule{Op: op, Fault: sim.FaultSlowAnswer, DelayMS: 800, Chance: 0.05}},
		{company, sim.Rule{Op: op, Fault: sim.FaultSlowAnswer, DelayMS: 3000, Chance: 0.03}},
	}
}

// undoFaults are an undo's faults (see [DefaultFaults]).
func undoFaults(company, op string) []Fault {
	return []Fault{
		{company, sim.Rule{Op: op, Fault: sim.FaultFail, Chance: 0.2}},
		{company, sim.Rule{Op: op, Fault: sim.FaultLoseAnswer, Chance: 0.05}},
		{company, sim.Rule{Op: op, Fault: sim.FaultSlowAnswer, DelayMS: 1000, Chance: 0.1}},
		{company, sim.Rule{Op: op, Fault: sim.FaultSlowAnswer, DelayMS: 3000, Chance: 0.05}},
	}
}
