//go:build !wasip1

// The same engine as a native program, for measuring it without WebAssembly: a JSON array of
// Requests on stdin, a JSON array of Results on stdout.
package main

import (
	"encoding/json"
	"os"
)

func main() {
	var reqs []Request
	if err := json.NewDecoder(os.Stdin).Decode(&reqs); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	out := make([]Result, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, Render(r))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		os.Exit(2)
	}
}
