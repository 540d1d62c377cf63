// Command croncheck asks KFP's own cron library what a schedule means.
//
// KFP's ScheduledWorkflow controller (backend/src/crd/controller/scheduledworkflow/util)
// parses a recurring run's cron with github.com/robfig/cron v1.2.0, the version KFP's go.mod
// pins, through cron.Parse: six fields, seconds first. draslice turns the usual five fields
// into that form (kfp_ops/cron.py). This program reads a JSON list of
// {"kfp": <what draslice sends>, "standard": <what the user wrote>} on stdin and answers, for
// each, the next fire times of cron.Parse(kfp) and cron.ParseStandard(standard) from one start
// time, or the library's parse error verbatim, so a test can compare the two meanings.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/robfig/cron"
)

type query struct {
	KFP      string `json:"kfp"`
	Standard string `json:"standard"`
	Start    string `json:"start"`
	Count    int    `json:"count"`
}

type answer struct {
	KFPNext       []string `json:"kfp_next"`
	KFPError      string   `json:"kfp_error,omitempty"`
	StandardNext  []string `json:"standard_next"`
	StandardError string   `json:"standard_error,omitempty"`
}

func next(s cron.Schedule, from time.Time, n int) []string {
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		from = s.Next(from)
		if from.IsZero() {
			break
		}
		out = append(out, from.UTC().Format(time.RFC3339))
	}
	return out
}

func main() {
	var queries []query
	if err := json.NewDecoder(os.Stdin).Decode(&queries); err != nil {
		fmt.Fprintf(os.Stderr, "croncheck: bad input: %v\n", err)
		os.Exit(2)
	}
	answers := make([]answer, 0, len(queries))
	for _, q := range queries {
		start, err := time.Parse(time.RFC3339, q.Start)
		if err != nil {
			fmt.Fprintf(os.Stderr, "croncheck: start %q: %v\n", q.Start, err)
			os.Exit(2)
		}
		var a answer
		if s, err := cron.Parse(q.KFP); err != nil {
			a.KFPError = err.Error()
		} else {
			a.KFPNext = next(s, start, q.Count)
		}
		if q.Standard != "" {
			if s, err := cron.ParseStandard(q.Standard); err != nil {
				a.StandardError = err.Error()
			} else {
				a.StandardNext = next(s, start, q.Count)
			}
		}
		answers = append(answers, a)
	}
	if err := json.NewEncoder(os.Stdout).Encode(answers); err != nil {
		fmt.Fprintf(os.Stderr, "croncheck: %v\n", err)
		os.Exit(1)
	}
}
