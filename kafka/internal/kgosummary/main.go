// Command kgosummary reads `go test -json` output and prints the count of passed,
// failed and skipped tests, then each failed test with the first lines it logged
// (kafka/kgo-suite.sh).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action string
	Test   string
	Output string
}

func main() {
	outputs := map[string][]string{}
	result := map[string]string{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Println(sc.Text()) // a build error, say
			continue
		}
		if e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "output":
			if len(outputs[e.Test]) < 12 && !strings.HasPrefix(e.Output, "=== ") {
				outputs[e.Test] = append(outputs[e.Test], strings.TrimRight(e.Output, "\n"))
			}
		case "pass", "fail", "skip":
			result[e.Test] = e.Action
		}
	}
	counts := map[string]int{}
	var failed []string
	for t, r := range result {
		counts[r]++
		if r == "fail" {
			failed = append(failed, t)
		}
	}
	sort.Strings(failed)
	fmt.Printf("pass %d  fail %d  skip %d\n", counts["pass"], counts["fail"], counts["skip"])
	for _, t := range failed {
		fmt.Printf("\nFAIL %s\n", t)
		for _, l := range outputs[t] {
			fmt.Printf("    %s\n", l)
		}
	}
}
