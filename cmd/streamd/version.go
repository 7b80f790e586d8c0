package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"

	schema "github.com/streamd/streamd/sql"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3"); else the build
// information says what it can (the VCS revision of a build from a checkout).
var version = ""

// versionInfo is what `streamd version` and `--version` print.
type versionInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	Schema    int    `json:"schema_migration"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: version, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	if all, err := schema.Migrations(); err == nil && len(all) > 0 {
		v.Schema = all[len(all)-1].Version
	}
	return v
}

func (v versionInfo) String() string {
	s := "streamd " + v.Version
	if v.Revision != "" {
		s += " (" + v.Revision
		if v.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return fmt.Sprintf("%s, %s, schema migration %d", s, v.GoVersion, v.Schema)
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print streamd's version, VCS revision, Go version and schema migration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			return g.print(cmd.OutOrStdout(), v, func(tw *tabwriter.Writer) {
				row(tw, v.String())
			})
		},
	}
}
