package streamconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// sections are the JSON sections of a Config, by their column names.
var sections = map[string]func(c *Config){
	"retention_config":      func(c *Config) { c.Retention = nil },
	"dead_letter_config":    func(c *Config) { c.DeadLetter = nil },
	"lifecycle_config":      func(c *Config) { c.Lifecycle = nil },
	"performance_config":    func(c *Config) { c.Performance = nil },
	"access_control_config": func(c *Config) { c.AccessControl = nil },
	"tags":                  func(c *Config) { c.Tags = nil },
}

// MergeJSON replaces the sections of c that raw, a JSON object keyed by section
// (retention_config, dead_letter_config, ...), gives, and keeps the others. An
// unknown section or key, or a value of the wrong type, is a *FieldError naming it
// (ErrInvalidConfig), and c is then unchanged: a misspelt key must not read as "no
// limit". The edges (CLI, API) decode a configuration with it.
func (c *Config) MergeJSON(raw []byte) error {
	var given map[string]json.RawMessage
	if err := json.Unmarshal(raw, &given); err != nil {
		return &FieldError{Field: "configuration", Problem: fmt.Sprintf("not a JSON object of sections: %v", err)}
	}
	next := *c
	for k, v := range given {
		clear, ok := sections[k]
		if !ok {
			return &FieldError{Field: k, Problem: "unknown section (the sections are retention_config, dead_letter_config, lifecycle_config, performance_config, access_control_config, tags)"}
		}
		clear(&next) // replace, not merge into, the current section
		one, _ := json.Marshal(map[string]json.RawMessage{k: v})
		dec := json.NewDecoder(bytes.NewReader(one))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&next); err != nil {
			return &FieldError{Field: k, Problem: err.Error()}
		}
	}
	*c = next
	return nil
}
