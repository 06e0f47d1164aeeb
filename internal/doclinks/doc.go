// Package doclinks holds the test that keeps the documentation's links whole: every relative
// link of a Markdown file, and every link to this repository's files on GitHub, must name a file
// that exists and, with a #fragment, a heading that file has. Pages are edited by many hands at
// once; a renamed section should break the build, not the reader's click.
package doclinks
