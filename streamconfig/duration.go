package streamconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// Duration is a time.Duration in the JSON forms of seed 003's configuration. It
// decodes a .NET TimeSpan string ("90.00:00:00", "01:30:00"), a Go duration string
// ("2160h", "90m") or a JSON number of seconds, and encodes as a TimeSpan string in
// whole seconds, the form the SQL side stores (sql/functions/0410_stream_config.sql).
type Duration time.Duration

// timeSpan is .NET's constant format [d.]hh:mm:ss[.fffffff].
var timeSpan = regexp.MustCompile(`^(?:([0-9]+)\.)?([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:\.([0-9]{1,7}))?$`)

// ParseDuration parses s as a TimeSpan or a Go duration string.
func ParseDuration(s string) (Duration, error) {
	if m := timeSpan.FindStringSubmatch(s); m != nil {
		var days int64
		if m[1] != "" {
			v, err := strconv.ParseInt(m[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%q: days out of range", s)
			}
			days = v
		}
		h, _ := strconv.Atoi(m[2])
		mi, _ := strconv.Atoi(m[3])
		sec, _ := strconv.Atoi(m[4])
		if h > 23 || mi > 59 || sec > 59 {
			return 0, fmt.Errorf("%q has hours over 23 or minutes or seconds over 59", s)
		}
		if days > int64(time.Duration(1<<63-1)/(24*time.Hour)) {
			return 0, fmt.Errorf("%q: days out of range", s)
		}
		d := time.Duration(days)*24*time.Hour + time.Duration(h)*time.Hour + time.Duration(mi)*time.Minute + time.Duration(sec)*time.Second
		if d < 0 {
			return 0, fmt.Errorf("%q is out of range", s)
		}
		if m[5] != "" {
			frac, _ := strconv.ParseFloat("0."+m[5], 64)
			d += time.Duration(frac * float64(time.Second))
		}
		return Duration(d), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (use \"d.hh:mm:ss\", a Go duration such as \"720h\", or seconds)", s)
	}
	return Duration(d), nil
}

// String returns the TimeSpan form in whole seconds: "90.00:00:00", "01:30:00".
func (d Duration) String() string {
	s := int64(time.Duration(d) / time.Second)
	out := ""
	if s >= 86400 {
		out = strconv.FormatInt(s/86400, 10) + "."
	}
	return out + fmt.Sprintf("%02d:%02d:%02d", (s%86400)/3600, (s%3600)/60, s%60)
}

// MarshalJSON encodes the TimeSpan form.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON decodes a TimeSpan string, a Go duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("%s is not a duration (use \"d.hh:mm:ss\", a Go duration such as \"720h\", or seconds)", b)
	}
	if secs < 0 || secs > float64((1<<63-1)/int64(time.Second)) {
		return fmt.Errorf("%s seconds is out of range", b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}
