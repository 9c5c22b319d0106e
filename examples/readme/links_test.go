package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestLinks fails for a relative link in README.md, CONTRIBUTING.md or
// docs/*.md whose file does not exist, or whose #anchor names no heading of
// the page it points to (GitHub's heading ids).
func TestLinks(t *testing.T) {
	pages := []string{"README.md", "CONTRIBUTING.md"}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, err := filepath.Rel(repoRoot, d)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, rel)
	}
	anchors := map[string]map[string]bool{} // by page path under the root
	anchorsOf := func(page string) (map[string]bool, error) {
		if a, ok := anchors[page]; ok {
			return a, nil
		}
		text, err := os.ReadFile(filepath.Join(repoRoot, page))
		if err != nil {
			return nil, err
		}
		anchors[page] = headingIDs(string(text))
		return anchors[page], nil
	}
	checked := 0
	for _, page := range pages {
		text, err := os.ReadFile(filepath.Join(repoRoot, page))
		if err != nil {
			t.Errorf("%s: %v", page, err)
			continue
		}
		for _, l := range links(string(text)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: link %q leaves the repository", page, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(repoRoot, target)); err != nil {
					t.Errorf("%s:%d: link %q: no file %s", page, l.line, l.target, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into a file that is not markdown", page, l.line, l.target)
				continue
			}
			ids, err := anchorsOf(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", page, l.line, l.target, err)
				continue
			}
			if !ids[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading #%s", page, l.line, l.target, target, anchor)
			}
		}
	}
	t.Logf("%d relative links checked in %d pages", checked, len(pages))
}

type link struct {
	target string
	line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
)

// links returns the targets of the inline links and link reference
// definitions of a markdown text, outside code blocks and code spans.
func links(text string) []link {
	var out []link
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		line = codeSpan.ReplaceAllString(line, "code")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{target: m[1], line: i + 1})
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			out = append(out, link{target: m[1], line: i + 1})
		}
	}
	return out
}

// headingIDs returns the ids GitHub gives the ATX headings of a markdown
// text: the text lower-cased, punctuation dropped, spaces turned into
// hyphens, and -1, -2, … appended to repeats. Explicit <a name> and id
// attributes count too.
func headingIDs(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			ids[m[1]] = true
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		id := slug(strings.TrimSpace(strings.TrimRight(strings.TrimSpace(line[level:]), "#")))
		if n := seen[id]; n > 0 {
			seen[id]++
			id = fmt.Sprintf("%s-%d", id, n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	}
	return ids
}

var (
	htmlID   = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	mdLinkIn = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// slug is GitHub's id for a heading's text (github-slugger): links become
// their text, then every character but letters, digits, '-', '_' and spaces
// is dropped, and each space becomes '-'.
func slug(heading string) string {
	heading = mdLinkIn.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
