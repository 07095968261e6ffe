// porcupine-checker: checks a joblease fault-run history (merged JSON Lines, see
// docs/history-format.md) against a sequential model of a JobLease and its fenced target,
// with Porcupine (github.com/anishathalye/porcupine).
//
// Usage: porcupine-checker -history FILE [-html PATH] [-always-html] [-timeout 60s]
//
// Exit codes: 0 linearizable, 1 a violation (the visualization is written to -html),
// 2 usage or input error, 3 the check timed out (result unknown).
//
// The model needs no real time: expiry is judged only from the server-time bounds recorded
// in the history. A claim may take over a held lease only if it could have happened, on
// the API server's clock, at or after the end of the holder's window (server_hi >=
// leaseUntil); a renew/complete/release may succeed only if it started before that end
// (server_lo < leaseUntil). Everything else is exact state: claim raises the generation by
// one and never succeeds on a completed lease; renew/complete/release need the current
// holder and generation; the target accepts a token only if it is >= the highest it has
// accepted. Operations whose outcome is unknown (timeout, crash) may or may not have taken
// effect (a nondeterministic step).
//
// Failed (maxAttempts used up, work pools) is terminal like Completed. It is entered by a
// failed release that used the last attempt (recorded with result phase "Failed"), or
// without a record of its own when an expired holder's attempt is counted (the operator's
// expiry, or a claim that finds the attempts used up and is refused as "finished"): so a
// held lease may turn Failed at a claim refused as finished or at a read, a free one never.
//
// Expired (the operator's unrecorded write once a window ended) is held in the model: it
// keeps holder and generation and may be taken over, but the holder's own operations are
// refused as stale from then on; such a refusal is legal once the window may have ended.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	ID       string                 `json:"id"`
	Process  string                 `json:"process"`
	Op       string                 `json:"op"`
	Lease    string                 `json:"lease"`
	Args     map[string]interface{} `json:"args"`
	CallNs   int64                  `json:"call_ns"`
	RetNs    *int64                 `json:"ret_ns"`
	ServerLo *float64               `json:"server_lo"`
	ServerHi *float64               `json:"server_hi"`
	Result   map[string]interface{} `json:"result"`
}

// input is what an operation asked for.
type input struct {
	ID       string
	Op       string
	Lease    string
	Holder   string
	Gen      int64
	Epoch    int64
	ServerLo float64 // NaN when unknown
	ServerHi float64
	Assign   bool // a claim a dispatcher made for Holder (issue 30): no window until adopted
}

// output is what it got.
type output struct {
	Status     string // ok, refused, unknown
	Reason     string
	Gen        int64
	Epoch      int64
	LeaseUntil float64 // 0 when absent
	Phase      string
	Holder     string
	CompGen    int64
}

const (
	free = iota
	held
	completed
	failed
)

// state of one JobLease and its fenced target. Comparable with ==.
type state struct {
	Phase   int
	Holder  string
	Epoch   int64
	Gen     int64
	Until   float64 // end of the current window on the server's clock; 0 = unknown
	CompGen int64
	TopE    int64
	TopG    int64
	HasTop  bool
	// Assigned: the current claim is a dispatcher's for Holder, not yet adopted (renewed)
	// by it: it ran nowhere, and the dispatcher may take it back before its window ends
	Assigned bool
}

func num(m map[string]interface{}, key string) int64 {
	if v, ok := m[key].(float64); ok {
		return int64(v)
	}
	return 0
}

func str(m map[string]interface{}, key string) string {
	if v, ok := m[key].(string); ok {
		return v
	}
	return ""
}

func toOperation(r record, clients map[string]int) porcupine.Operation {
	in := input{ID: r.ID, Op: r.Op, Lease: r.Lease, Holder: str(r.Args, "holder"),
		Gen: num(r.Args, "generation"), Epoch: num(r.Args, "epoch"),
		ServerLo: math.NaN(), ServerHi: math.NaN(), Assign: r.Args["assign"] == true}
	if tok, ok := r.Args["token"].([]interface{}); ok && len(tok) == 2 {
		in.Epoch, in.Gen = int64(tok[0].(float64)), int64(tok[1].(float64))
	}
	if r.ServerLo != nil {
		in.ServerLo = *r.ServerLo
	}
	out := output{Status: str(r.Result, "status"), Reason: str(r.Result, "reason"),
		Gen: num(r.Result, "generation"), Epoch: num(r.Result, "epoch"),
		Phase: str(r.Result, "phase"), Holder: str(r.Result, "holder")}
	if out.Status == "" {
		out.Status = "unknown"
	}
	if v, ok := r.Result["lease_until"].(float64); ok {
		out.LeaseUntil = v
	}
	if c, ok := r.Result["completion"].(map[string]interface{}); ok {
		out.CompGen = num(c, "generation")
	}
	ret := int64(math.MaxInt64 / 2)
	if r.RetNs != nil && out.Status != "unknown" {
		ret = *r.RetNs
		if r.ServerHi != nil {
			in.ServerHi = *r.ServerHi
		}
	}
	if _, ok := clients[r.Process]; !ok {
		clients[r.Process] = len(clients)
	}
	return porcupine.Operation{ClientId: clients[r.Process], Input: in, Call: r.CallNs,
		Output: out, Return: ret}
}

func tokenLess(e1, g1, e2, g2 int64) bool { return e1 < e2 || (e1 == e2 && g1 < g2) }

func current(s state, in input) bool {
	return s.Phase == held && s.Holder == in.Holder && s.Gen == in.Gen
}

// mayHaveExpired: the operator may have marked the holder's lease Expired (holder and
// generation stay, the phase is no longer Held) before the operation read it, because the
// operation may have read it at or after the window's end on the server clock. That write
// has no record of its own; the holder's renew/complete/release is then refused as stale.
func mayHaveExpired(s state, in input) bool {
	return s.Phase == held && (s.Until == 0 || math.IsNaN(in.ServerHi) || in.ServerHi >= s.Until)
}

// applied returns the state after a successful operation, and whether it was allowed.
func applied(s state, in input, out output, known bool) (bool, state) {
	switch in.Op {
	case "claim":
		if s.Phase == completed || s.Phase == failed {
			return false, s
		}
		gen, epoch := s.Gen+1, s.Epoch
		if known {
			// epoch 0: not known yet (no claim so far, or only claims whose answer was lost)
			if out.Gen != gen || (s.Epoch != 0 && out.Epoch != s.Epoch) {
				return false, s
			}
			epoch = out.Epoch
			// a takeover must be able to lie after the holder's window on the server clock,
			// unless the holder never adopted a dispatcher's claim (it never ran)
			if s.Phase == held && !s.Assigned && s.Until > 0 && !math.IsNaN(in.ServerHi) &&
				in.ServerHi < s.Until {
				return false, s
			}
		}
		n := s
		n.Phase, n.Holder, n.Gen, n.Epoch, n.Until = held, in.Holder, gen, epoch, 0
		n.Assigned = in.Assign
		if known {
			n.Until = out.LeaseUntil
		}
		return true, n
	case "renew", "complete", "release":
		if !current(s, in) {
			return false, s
		}
		if known && s.Until > 0 && !math.IsNaN(in.ServerLo) && in.ServerLo >= s.Until {
			return false, s // the window had ended before the operation started
		}
		n := s
		n.Assigned = false // adopted (renew), or over
		switch in.Op {
		case "renew":
			n.Until = 0
			if known {
				n.Until = out.LeaseUntil
			}
		case "complete":
			n.Phase, n.CompGen, n.Until = completed, in.Gen, 0
		case "release":
			n.Phase, n.Until = free, 0
			if known && out.Phase == "Failed" {
				n.Phase = failed
			}
		}
		return true, n
	case "write":
		if s.HasTop && tokenLess(in.Epoch, in.Gen, s.TopE, s.TopG) {
			return false, s
		}
		if in.Gen > s.Gen {
			return false, s // a token that was never handed out
		}
		n := s
		n.TopE, n.TopG, n.HasTop = in.Epoch, in.Gen, true
		return true, n
	case "read":
		phase := map[string]int{"Available": free, "Held": held, "Expired": held,
			"Completed": completed, "Failed": failed}[out.Phase]
		if out.Phase == "Available" && s.Phase == held {
			return false, s
		}
		if phase == failed && s.Phase == held && out.Gen == s.Gen {
			n := s // the holder's expired attempt was the last one (unrecorded)
			n.Phase, n.Until = failed, 0
			return true, n
		}
		if phase != s.Phase || out.Gen != s.Gen || (phase == completed && out.CompGen != s.CompGen) {
			return false, s
		}
		return true, s
	}
	return true, s
}

func refusedOK(s state, in input, out output) bool {
	switch {
	case in.Op == "claim" && out.Reason == "held":
		return s.Phase == held
	case in.Op == "claim" && out.Reason == "finished":
		return s.Phase == completed || s.Phase == failed || s.Phase == held
	case (in.Op == "renew" || in.Op == "complete" || in.Op == "release") && out.Reason == "stale":
		return !current(s, in) || mayHaveExpired(s, in)
	case in.Op == "write" && out.Reason == "stale":
		return s.HasTop && tokenLess(in.Epoch, in.Gen, s.TopE, s.TopG)
	}
	return true
}

var model = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		groups := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(input).Lease
			if _, ok := groups[k]; !ok {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], op)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, groups[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{state{}} },
	Step: func(st, inp, outp interface{}) []interface{} {
		s, in, out := st.(state), inp.(input), outp.(output)
		switch out.Status {
		case "ok":
			if ok, n := applied(s, in, out, true); ok {
				return []interface{}{n}
			}
			return nil
		case "refused":
			if !refusedOK(s, in, out) {
				return nil
			}
			if in.Op == "claim" && out.Reason == "finished" && s.Phase == held {
				n := s // the expired holder's attempt was the last: Failed from now on
				n.Phase, n.Until = failed, 0
				return []interface{}{n}
			}
			return []interface{}{s}
		default: // unknown: it may or may not have taken effect
			if in.Op == "read" {
				return []interface{}{s}
			}
			if ok, n := applied(s, in, out, false); ok && n != s {
				return []interface{}{s, n}
			}
			return []interface{}{s}
		}
	},
	DescribeOperation: func(inp, outp interface{}) string {
		in, out := inp.(input), outp.(output)
		var what string
		switch in.Op {
		case "claim":
			what = fmt.Sprintf("claim(%s)", in.Holder)
		case "write":
			what = fmt.Sprintf("write(%s, %d/%d)", in.Holder, in.Epoch, in.Gen)
		case "read":
			what = "read()"
		default:
			what = fmt.Sprintf("%s(%s, gen %d)", in.Op, in.Holder, in.Gen)
		}
		switch out.Status {
		case "ok":
			if in.Op == "claim" {
				return fmt.Sprintf("%s → gen %d", what, out.Gen)
			}
			if in.Op == "read" {
				return fmt.Sprintf("%s → %s gen %d", what, out.Phase, out.Gen)
			}
			return what + " → ok"
		case "refused":
			return fmt.Sprintf("%s → refused (%s)", what, out.Reason)
		}
		return what + " → ?"
	},
	DescribeState: func(st interface{}) string {
		s := st.(state)
		phase := []string{"free", "held", "completed", "failed"}[s.Phase]
		return fmt.Sprintf("%s holder=%q gen=%d/%d target≥%d/%d", phase, s.Holder, s.Epoch,
			s.Gen, s.TopE, s.TopG)
	},
}

func main() {
	historyPath := flag.String("history", "", "merged history (JSON Lines)")
	htmlPath := flag.String("html", "", "where to write the visualization on a violation")
	always := flag.Bool("always-html", false, "write the visualization even when linearizable")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long (exit 3)")
	flag.Parse()
	if *historyPath == "" {
		fmt.Fprintln(os.Stderr, "usage: porcupine-checker -history FILE [-html PATH]")
		os.Exit(2)
	}
	f, err := os.Open(*historyPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer f.Close()
	var ops []porcupine.Operation
	clients := map[string]int{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		if len(scanner.Bytes()) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(scanner.Bytes(), &r); err != nil {
			fmt.Fprintf(os.Stderr, "bad history line: %v\n", err)
			os.Exit(2)
		}
		ops = append(ops, toOperation(r, clients))
	}
	m := model.ToModel()
	result, info := porcupine.CheckOperationsVerbose(m, ops, *timeout)
	names := map[porcupine.CheckResult]string{porcupine.Ok: "ok", porcupine.Illegal: "illegal",
		porcupine.Unknown: "unknown"}
	summary := map[string]interface{}{"result": names[result], "operations": len(ops)}
	if *htmlPath != "" && (result != porcupine.Ok || *always) {
		if err := porcupine.VisualizePath(m, info, *htmlPath); err != nil {
			fmt.Fprintf(os.Stderr, "visualization: %v\n", err)
		} else {
			summary["html"] = *htmlPath
		}
	}
	line, _ := json.Marshal(summary)
	fmt.Println(string(line))
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(3)
	}
}
