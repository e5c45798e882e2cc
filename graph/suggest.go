package graph

import (
	"fmt"

	"github.com/agext/levenshtein"
)

// didYouMean returns `; did you mean "x"?` naming the closest candidate
// within a small edit distance, or "".
func didYouMean(given string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := levenshtein.Distance(given, c, nil); d < bestDist {
			best, bestDist = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}
