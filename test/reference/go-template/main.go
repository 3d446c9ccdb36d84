// Reference renderer for the Go-template tests: Go's text/template with sprig and the extra
// functions Deckhouse's bashible-apiserver registers (toYaml, toJson), data decoded from JSON as
// Deckhouse decodes its context (numbers are float64). Reads a JSON array of {template, data}
// on stdin and writes a JSON array of {out} or {err}.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

type testCase struct {
	Template string                 `json:"template"`
	Data     map[string]interface{} `json:"data"`
}

type result struct {
	Out *string `json:"out,omitempty"`
	Err *string `json:"err,omitempty"`
}

func funcs() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	// Deckhouse's engine adds `required` (and placeholders for include/tpl, which NGCs cannot use).
	f["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		} else if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	return f
}

func render(c testCase) result {
	t, err := template.New("ngc").Funcs(funcs()).Parse(c.Template)
	if err != nil {
		msg := err.Error()
		return result{Err: &msg}
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, c.Data); err != nil {
		msg := err.Error()
		return result{Err: &msg}
	}
	out := buf.String()
	return result{Out: &out}
}

func main() {
	var cases []testCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	results := make([]result, 0, len(cases))
	for _, c := range cases {
		results = append(results, render(c))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(results); err != nil {
		os.Exit(2)
	}
}
