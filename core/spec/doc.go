// Package spec is configuration as gateways write it (JSON, or option lines
// of words), declared once: limits, policies with their plans, adaptive
// control, and the checks shared by every adapter. Each spec knows its
// fields and validates itself with errors that name the field and the
// value; an adapter embeds them in its own config and adds where the error
// was written (a config file's line, a JSON path).
package spec
