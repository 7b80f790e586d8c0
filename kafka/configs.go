package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// The topic configs streamd maps onto a stream's configuration (docs/kafka.md).
const (
	cfgCleanupPolicy   = "cleanup.policy"         // retention_config.cleanupPolicy
	cfgRetentionMs     = "retention.ms"           // retention_config.maxAge (whole seconds)
	cfgRetentionBytes  = "retention.bytes"        // retention_config.maxSizeBytes (per partition)
	cfgMaxMessageBytes = "max.message.bytes"      // streams.max_payload_bytes
	cfgTimestampType   = "message.timestamp.type" // always LogAppendTime (read only)
	cfgValueFormat     = "streamd.value.format"   // streams.value_format: any or json
	cfgCompression     = "compression.type"       // performance_config.enableCompression, compressionCodec
)

// errInvalidConfig: a config name or value streamd does not take (INVALID_CONFIG).
var errInvalidConfig = errors.New("invalid config")

// topicSettings is a stream's Kafka-visible configuration, read and changed as one.
type topicSettings struct {
	cfg         *streamconfig.Config
	maxPayload  int32
	valueFormat string
	// defaultCompression is the server's Config.Compression: the compression.type
	// of a topic whose performance_config says nothing.
	defaultCompression string
}

type configEntry struct {
	name      string
	value     *string
	isDefault bool
	readOnly  bool
	typ       kmsg.ConfigType
}

func strp(s string) *string { return &s }

// entries lists the mapped configs with their current values.
func (t *topicSettings) entries() []configEntry {
	r := t.cfg.Retention
	out := []configEntry{}
	policy, pDefault := "delete", true
	if r != nil && r.CleanupPolicy != "" {
		policy, pDefault = string(r.CleanupPolicy), false
	}
	out = append(out, configEntry{name: cfgCleanupPolicy, value: strp(policy), isDefault: pDefault, typ: kmsg.ConfigTypeList})
	ms, msDefault := "-1", true
	if r != nil && r.MaxAge != nil {
		ms, msDefault = strconv.FormatInt(time.Duration(*r.MaxAge).Milliseconds(), 10), false
	}
	out = append(out, configEntry{name: cfgRetentionMs, value: strp(ms), isDefault: msDefault, typ: kmsg.ConfigTypeLong})
	b, bDefault := "-1", true
	if r != nil && r.MaxSizeBytes != nil {
		b, bDefault = strconv.FormatInt(*r.MaxSizeBytes, 10), false
	}
	out = append(out, configEntry{name: cfgRetentionBytes, value: strp(b), isDefault: bDefault, typ: kmsg.ConfigTypeLong})
	out = append(out, configEntry{name: cfgMaxMessageBytes, value: strp(strconv.Itoa(int(t.maxPayload))),
		isDefault: t.maxPayload == 1<<20, typ: kmsg.ConfigTypeInt})
	out = append(out, configEntry{name: cfgTimestampType, value: strp("LogAppendTime"), readOnly: true, isDefault: true, typ: kmsg.ConfigTypeString})
	out = append(out, configEntry{name: cfgValueFormat, value: strp(t.valueFormat), isDefault: t.valueFormat == "any", typ: kmsg.ConfigTypeString})
	p := t.cfg.Performance
	out = append(out, configEntry{name: cfgCompression, value: strp(compressionOf(p, t.defaultCompression)),
		isDefault: p == nil || p.EnableCompression == nil, typ: kmsg.ConfigTypeString})
	return out
}

func (t *topicSettings) retention() *streamconfig.Retention {
	if t.cfg.Retention == nil {
		t.cfg.Retention = &streamconfig.Retention{}
	}
	return t.cfg.Retention
}

// set sets name to value; a nil value resets it to its default (Kafka's DELETE).
func (t *topicSettings) set(name string, value *string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", errInvalidConfig, name, fmt.Sprintf(format, args...))
	}
	switch name {
	case cfgCleanupPolicy:
		if value == nil {
			if t.cfg.Retention != nil {
				t.cfg.Retention.CleanupPolicy = ""
			}
			return nil
		}
		parts := strings.Split(strings.ReplaceAll(*value, " ", ""), ",")
		has := map[string]bool{}
		for _, p := range parts {
			if p != "delete" && p != "compact" {
				return bad("%q is not delete, compact or compact,delete", *value)
			}
			has[p] = true
		}
		switch {
		case has["delete"] && has["compact"]:
			t.retention().CleanupPolicy = streamconfig.CleanupCompactDelete
		case has["compact"]:
			t.retention().CleanupPolicy = streamconfig.CleanupCompact
		default:
			t.retention().CleanupPolicy = streamconfig.CleanupDelete
		}
	case cfgRetentionMs:
		if value == nil || *value == "-1" {
			if t.cfg.Retention != nil {
				t.cfg.Retention.MaxAge = nil
			}
			return nil
		}
		ms, err := strconv.ParseInt(*value, 10, 64)
		if err != nil || ms < 1000 || ms%1000 != 0 {
			return bad("%q must be -1 or a whole number of seconds in milliseconds (streamd keeps whole seconds)", *value)
		}
		d := streamconfig.Duration(time.Duration(ms) * time.Millisecond)
		t.retention().MaxAge = &d
	case cfgRetentionBytes:
		if value == nil || *value == "-1" {
			if t.cfg.Retention != nil {
				t.cfg.Retention.MaxSizeBytes = nil
			}
			return nil
		}
		n, err := strconv.ParseInt(*value, 10, 64)
		if err != nil || n < 0 {
			return bad("%q must be -1 or a byte count", *value)
		}
		t.retention().MaxSizeBytes = &n
	case cfgMaxMessageBytes:
		if value == nil {
			t.maxPayload = 1 << 20
			return nil
		}
		n, err := strconv.ParseInt(*value, 10, 32)
		if err != nil || n < 1 {
			return bad("%q must be a positive byte count", *value)
		}
		t.maxPayload = int32(n)
	case cfgValueFormat:
		if value == nil {
			t.valueFormat = "any"
			return nil
		}
		if *value != "any" && *value != "json" {
			return bad("%q is not any or json", *value)
		}
		t.valueFormat = *value
	case cfgCompression:
		return t.setCompression(value)
	case cfgTimestampType:
		if value != nil && *value != "LogAppendTime" {
			return bad("streamd stamps records with the log's time: only LogAppendTime")
		}
	default:
		return bad("not a config streamd maps (docs/kafka.md lists them)")
	}
	return nil
}

// setCompression maps compression.type onto performance_config: a codec enables
// compression with it, uncompressed disables it, and producer or nil (DELETE) removes
// both keys, so the topic follows the server's default (streamd keeps records, not
// the producer's batches: there is no producer's codec to keep).
func (t *topicSettings) setCompression(value *string) error {
	p := t.cfg.Performance
	if p == nil {
		p = &streamconfig.Performance{}
	}
	switch {
	case value == nil || *value == compressionProducer:
		p.EnableCompression, p.CompressionCodec = nil, ""
	case *value == compressionUncompressed:
		off := false
		p.EnableCompression, p.CompressionCodec = &off, ""
	case compressionCodecs[*value] != codecNone:
		on := true
		p.EnableCompression, p.CompressionCodec = &on, *value
	default:
		return fmt.Errorf("%w: %s: %q is not uncompressed, gzip, snappy, lz4, zstd or producer", errInvalidConfig, cfgCompression, *value)
	}
	if p.BatchSize == 0 && p.EnableCompression == nil {
		p = nil
	}
	t.cfg.Performance = p
	return nil
}

// loadTopicSettings reads stream's settings in db; defaultCompression is the
// server's Config.Compression.
func loadTopicSettings(ctx context.Context, db pgx.Tx, stream, defaultCompression string) (*topicSettings, error) {
	info, err := streams.DescribeStreamTx(ctx, db, stream)
	if err != nil {
		return nil, err
	}
	cfg, err := streamconfig.GetTx(ctx, db, stream)
	if err != nil {
		return nil, err
	}
	return &topicSettings{cfg: cfg, maxPayload: info.MaxPayloadBytes, valueFormat: info.ValueFormat,
		defaultCompression: defaultCompression}, nil
}

// save writes t to stream in db (the caller's transaction), all or nothing.
func (t *topicSettings) save(ctx context.Context, db pgx.Tx, stream string) error {
	if err := t.cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errInvalidConfig, err)
	}
	if err := streamconfig.SetTx(ctx, db, stream, t.cfg); err != nil {
		return err
	}
	if err := streams.SetMaxPayloadBytesTx(ctx, db, stream, t.maxPayload); err != nil {
		return err
	}
	return streams.SetValueFormatTx(ctx, db, stream, t.valueFormat)
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
