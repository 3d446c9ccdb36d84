//go:build wasip1

// The WebAssembly entry points the bundle server calls (cluster/render/go-template.ts): a
// reactor (-buildmode=c-shared) whose runtime stays up between calls. The host writes a JSON
// Request into the buffer bb_input returns, calls bb_render with its length, and reads the JSON
// Result of that length at bb_output.
package main

import (
	"encoding/json"
	// Time zones for date functions (dateInZone, htmlDateInZone): the module sees no
	// /usr/share/zoneinfo, and sprig silently falls back to UTC for an unknown zone.
	_ "time/tzdata"
	"unsafe"
)

func main() {}

var input, output []byte

//go:wasmexport bb_input
func bbInput(size uint32) uint32 {
	if uint32(cap(input)) < size {
		input = make([]byte, size)
	}
	input = input[:size]
	if size == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&input[0])))
}

//go:wasmexport bb_render
func bbRender(size uint32) uint32 {
	var res Result
	if req, err := decodeRequest(input[:size]); err != nil {
		res = Result{Err: err.Error(), Reason: "the bundle server sent a request the template engine cannot read: " + err.Error()}
	} else {
		res = Render(req)
	}
	out, err := json.Marshal(res)
	if err != nil {
		out = []byte(`{"err":"cannot encode the result","reason":"cannot encode the result"}`)
	}
	output = out
	// Large requests (a big context) need not stay allocated.
	if cap(input) > 1<<20 {
		input = nil
	}
	return uint32(len(output))
}

//go:wasmexport bb_output
func bbOutput() uint32 {
	if len(output) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&output[0])))
}
