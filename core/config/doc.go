// Package config is configuration as gateways write it (JSON, or option
// lines of words), declared once, and the one place it becomes a gate's
// plan: Compile checks a config's policies (each rule once, in one
// wording, and against the store they will run on) and builds them into an
// immutable Compiled config, with its store, what each request takes and
// each response charges; Open opens its store. It sits above the stores
// and the request pipeline (core/gate), which knows neither. Each spec
// knows its fields and validates itself with errors that name the field
// and the value; an adapter embeds them in its own config and adds where
// the error was written (a config file's line, a JSON path).
package config
