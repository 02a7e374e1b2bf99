// Package kongschema reads a plugin schema written in Kong's schema
// language (kong/db/schema, in the structure Kong's metaschema allows) and
// checks configs against it as Kong does: Kong's defaults, field
// validators and entity checks, in Kong's words. A Go plugin server gives
// Kong its schema verbatim through `-dump`, so one declaration is both what
// the Admin API validates with and what the plugin checks, and the two
// cannot disagree.
//
// It takes the declarative part of the language: types string, number,
// integer, boolean, array, map and record; the attributes below; and the
// at_least_one_of, conditional and conditional_at_least_one_of entity
// checks. Parse refuses anything else, so a declaration never says more
// than this package checks. Kong's custom validators are Lua functions and
// cannot travel in a dump: a plugin checks those rules in its own code.
package kongschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Schema is a plugin's schema: fields (one "config" record for a plugin)
// and entity checks over them, named by dotted paths ("config.policy").
type Schema struct {
	Fields       []map[string]*Field `json:"fields"`
	EntityChecks []Check             `json:"entity_checks"`

	declared []byte // the declaration as written, for Dump
}

// Field declares one field. Attributes left zero are absent.
type Field struct {
	Type          string              `json:"type"`
	Description   string              `json:"description"` // for people: Kong shows it, checks nothing
	Required      *bool               `json:"required"`    // nil: not said (a record field is then required, as Kong makes it)
	Default       any                 `json:"default"`
	Referenceable bool                `json:"referenceable"` // may be a vault reference
	Encrypted     bool                `json:"encrypted"`     // stored encrypted by Kong
	Fields        []map[string]*Field `json:"fields"`        // record
	EntityChecks  []Check             `json:"entity_checks"` // record
	Elements      *Field              `json:"elements"`      // array
	Keys          *Field              `json:"keys"`          // map
	Values        *Field              `json:"values"`        // map

	Eq         any       `json:"eq"`
	Ne         any       `json:"ne"`
	OneOf      []any     `json:"one_of"`
	Gt         *float64  `json:"gt"`
	Between    []float64 `json:"between"` // [low, high], inclusive
	LenEq      *int      `json:"len_eq"`  // strings and arrays
	LenMin     *int      `json:"len_min"` // strings default to 1, as Kong's
	StartsWith string    `json:"starts_with"`
	MatchNone  []Match   `json:"match_none"`
	MatchAll   []Match   `json:"match_all"`
}

// Match is a Lua pattern and the error when it decides against a value.
type Match struct {
	Pattern string `json:"pattern"`
	Err     string `json:"err"`
	re      interface{ MatchString(string) bool }
}

// Check is one entity check; exactly one member is set.
type Check struct {
	AtLeastOneOf            []string                 `json:"at_least_one_of"`
	Conditional             *Conditional             `json:"conditional"`
	ConditionalAtLeastOneOf *ConditionalAtLeastOneOf `json:"conditional_at_least_one_of"`
}

// Conditional: when IfField passes IfMatch, ThenField must pass ThenMatch.
type Conditional struct {
	IfField   string `json:"if_field"`
	IfMatch   *Field `json:"if_match"`
	ThenField string `json:"then_field"`
	ThenMatch *Field `json:"then_match"`
	ThenErr   string `json:"then_err"`
}

// ConditionalAtLeastOneOf: when IfField passes IfMatch, one of
// ThenAtLeastOneOf must be non-empty. ThenErr's %s is the quoted list.
type ConditionalAtLeastOneOf struct {
	IfField          string   `json:"if_field"`
	IfMatch          *Field   `json:"if_match"`
	ThenAtLeastOneOf []string `json:"then_at_least_one_of"`
	ThenErr          string   `json:"then_err"`
}

// Parse reads a declaration. Every attribute must be one this package
// checks, every pattern must compile, every check must name declared
// fields and every default must pass its own field.
func Parse(declaration []byte) (*Schema, error) {
	dec := json.NewDecoder(bytes.NewReader(declaration))
	dec.DisallowUnknownFields()
	s := &Schema{declared: declaration}
	if err := dec.Decode(s); err != nil {
		return nil, fmt.Errorf("kong schema: %w", err)
	}
	if err := s.prepare(s.Fields, s.EntityChecks, ""); err != nil {
		return nil, fmt.Errorf("kong schema: %w", err)
	}
	makeRecordsRequired(s.Fields)
	return s, nil
}

// MustParse is Parse for a declaration compiled into a program; it panics
// on error (a test keeps the declaration sound).
func MustParse(declaration []byte) *Schema {
	s, err := Parse(declaration)
	if err != nil {
		panic(err)
	}
	return s
}

// Decode checks the JSON object b with Check (filling its defaults) and
// decodes the result into each of targets.
func (s *Schema) Decode(b []byte, targets ...any) error {
	var config map[string]any
	if err := json.Unmarshal(b, &config); err != nil {
		return err
	}
	if err := s.Check(config); err != nil {
		return err
	}
	b, err := json.Marshal(config)
	for _, t := range targets {
		if err == nil {
			err = json.Unmarshal(b, t)
		}
	}
	return err
}

// makeRecordsRequired does what Kong 3.9.3 does to a plugin's schema when
// it loads it (kong/db/schema/entity.lua, make_records_required, called by
// Entity.new_subschema): every record field, at any depth of records, that
// does not say `required` becomes required, so Kong fills it from its
// fields' defaults when it stores a config. Records inside arrays are not
// fields and stay as declared. A record that must stay null unless a user
// writes it says `"required": false`.
func makeRecordsRequired(fields []map[string]*Field) {
	for _, entry := range fields {
		for _, f := range entry {
			if f.Type != "record" {
				continue
			}
			if f.Required == nil {
				yes := true
				f.Required = &yes
			}
			makeRecordsRequired(f.Fields)
		}
	}
}

// isRequired reports whether f says it is required (after
// makeRecordsRequired for the schema's own fields).
func (f *Field) isRequired() bool { return f.Required != nil && *f.Required }

func (s *Schema) prepare(fields []map[string]*Field, checks []Check, path string) error {
	for _, entry := range fields {
		for name, f := range entry {
			if err := s.prepareField(f, join(path, name)); err != nil {
				return err
			}
		}
	}
	for _, c := range checks {
		var names []string
		switch {
		case c.AtLeastOneOf != nil:
			names = c.AtLeastOneOf
		case c.Conditional != nil:
			names = []string{c.Conditional.IfField, c.Conditional.ThenField}
			for _, m := range []*Field{c.Conditional.IfMatch, c.Conditional.ThenMatch} {
				if err := s.prepareField(m, path+" entity check"); err != nil {
					return err
				}
			}
		case c.ConditionalAtLeastOneOf != nil:
			names = append([]string{c.ConditionalAtLeastOneOf.IfField}, c.ConditionalAtLeastOneOf.ThenAtLeastOneOf...)
			if err := s.prepareField(c.ConditionalAtLeastOneOf.IfMatch, path+" entity check"); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: an entity check of no kind this package knows", path)
		}
		for _, name := range names {
			if lookup(fields, name) == nil {
				return fmt.Errorf("%s: entity check names %q, which is not declared", path, name)
			}
		}
	}
	return nil
}

func (s *Schema) prepareField(f *Field, path string) error {
	if f == nil {
		return fmt.Errorf("%s: missing declaration", path)
	}
	for _, list := range [][]Match{f.MatchNone, f.MatchAll} {
		for i := range list {
			re, err := luaPattern(list[i].Pattern)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			list[i].re = re
		}
	}
	if f.Elements != nil {
		if err := s.prepareField(f.Elements, path+"[]"); err != nil {
			return err
		}
	}
	if f.Type == "map" {
		if f.Keys == nil || f.Values == nil {
			return fmt.Errorf("%s: a map declares its keys and its values", path)
		}
		if err := s.prepareField(f.Keys, path+" keys"); err != nil {
			return err
		}
		if err := s.prepareField(f.Values, path+" values"); err != nil {
			return err
		}
	}
	if f.Default != nil {
		var errs []string
		if msg := s.value(f, f.Type, cloneJSON(f.Default), path, &errs); msg != "" || len(errs) > 0 {
			return fmt.Errorf("%s: default %v fails its own field: %s%s", path, f.Default, msg, strings.Join(errs, "; "))
		}
	}
	return s.prepare(f.Fields, f.EntityChecks, path)
}

// Check fills config's missing fields with their defaults, as Kong does
// when it stores a config, then validates it. config is the plugin's
// "config" record as Kong sends it (null for an unset field; the fields
// Kong adds itself, such as route_id, are not the schema's and are
// ignored; any other undeclared field is refused).
// The error lists every failure as "path: Kong's message (got value)".
func (s *Schema) Check(config map[string]any) error {
	if config == nil { // JSON null: there is no record to fill
		return errors.New("config: expected a record (got null)")
	}
	var errs []string
	s.record(s.Fields, s.EntityChecks, map[string]any{"config": config}, "", &errs)
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func (s *Schema) record(fields []map[string]*Field, checks []Check, obj map[string]any, path string, errs *[]string) {
	for _, entry := range fields {
		for name, f := range entry {
			p := join(path, name)
			v := obj[name]
			if v == nil {
				switch {
				case f.Default != nil:
					v = cloneJSON(f.Default)
				case f.isRequired() && f.Type == "record":
					v = map[string]any{} // Kong expands a required record to its defaults
				}
				if v != nil {
					obj[name] = v
				}
			}
			if v == nil {
				if f.isRequired() {
					*errs = append(*errs, p+": required field missing")
				}
				continue
			}
			if msg := s.value(f, f.Type, v, p, errs); msg != "" {
				*errs = append(*errs, p+": "+msg+got(v))
			}
		}
	}
	for name := range obj {
		if lookup(fields, name) == nil && !(path == "config" && addedByKong[name]) {
			*errs = append(*errs, join(path, name)+": unknown field")
		}
	}
	for _, c := range checks {
		s.entityCheck(c, fields, obj, path, errs)
	}
}

// addedByKong are the members Kong 3.9.3 adds to a plugin's config before
// it gives it to the plugin (kong/runloop/plugins_iterator.lua,
// get_plugin_config); any other member the schema does not declare is
// refused, in the words of Kong's Admin API, which refuses it first.
var addedByKong = map[string]bool{
	"route_id": true, "service_id": true, "consumer_id": true, "plugin_instance_name": true,
	"__plugin_id": true, "__ws_id": true, "__key__": true, "__seq__": true,
}

// value checks v against f read as type typ, and returns the first
// failure in Kong's words; records and arrays report their members'
// failures to errs themselves.
func (s *Schema) value(f *Field, typ string, v any, path string, errs *[]string) string {
	n, isNumber := v.(float64)
	length := -1
	switch typ {
	case "string":
		str, ok := v.(string)
		if !ok {
			return "expected a string"
		}
		length = len(str)
	case "number":
		if !isNumber {
			return "expected a number"
		}
	case "integer":
		if !isNumber || n != math.Trunc(n) || math.IsInf(n, 0) {
			return "expected an integer"
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return "expected a boolean"
		}
	case "array", "set": // a set's elements are unique: Kong drops repeats, and so may we
		list, ok := v.([]any)
		if !ok {
			return "expected an array"
		}
		length = len(list)
		for i, e := range list {
			p := fmt.Sprintf("%s[%d]", path, i)
			if e == nil {
				*errs = append(*errs, p+": required field missing")
			} else if msg := s.value(f.Elements, f.Elements.Type, e, p, errs); msg != "" {
				*errs = append(*errs, p+": "+msg+got(e))
			}
		}
	case "record":
		m, ok := v.(map[string]any)
		if !ok {
			return "expected a record"
		}
		s.record(f.Fields, f.EntityChecks, m, path, errs)
	case "map":
		m, ok := v.(map[string]any)
		if !ok {
			return "expected a map"
		}
		length = len(m)
		// Kong validates a map's keys and values (kong/db/schema/init.lua,
		// validate_field's map case) and reports the first failure at the
		// map's own path: err.config.limits.seco, not ...limits.video.seco.
		// Entries are checked in key order, so the report is stable.
		names := make([]string, 0, len(m))
		for k := range m {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			if msg := s.value(f.Keys, f.Keys.Type, k, path, errs); msg != "" {
				return msg + got(k)
			}
			e := m[k]
			if e == nil {
				if f.Values.isRequired() {
					return "required field missing"
				}
				continue
			}
			var nested []string
			if msg := s.value(f.Values, f.Values.Type, e, path, &nested); msg != "" {
				return msg + got(e)
			}
			if len(nested) > 0 {
				*errs = append(*errs, nested...)
				return ""
			}
		}
	default:
		return fmt.Sprintf("invalid type: %s", typ)
	}

	// Kong's validators, in Kong's order.
	switch {
	case f.Eq != nil && !reflect.DeepEqual(v, f.Eq):
		return fmt.Sprintf("value must be %v", f.Eq)
	case f.Ne != nil && reflect.DeepEqual(v, f.Ne):
		return fmt.Sprintf("value must not be %v", f.Ne)
	case f.OneOf != nil && !oneOf(v, f.OneOf):
		words := make([]string, len(f.OneOf))
		for i, o := range f.OneOf {
			words[i] = fmt.Sprint(o)
		}
		return "expected one of: " + strings.Join(words, ", ")
	case f.Gt != nil && isNumber && !(n > *f.Gt):
		return "value must be greater than " + num(*f.Gt)
	case len(f.Between) == 2 && isNumber && (n < f.Between[0] || n > f.Between[1]):
		return "value should be between " + num(f.Between[0]) + " and " + num(f.Between[1])
	}
	if f.LenEq != nil && length >= 0 && length != *f.LenEq {
		return fmt.Sprintf("length must be %d", *f.LenEq)
	}
	lenMin := f.LenMin
	if lenMin == nil && typ == "string" {
		one := 1 // empty strings are refused unless a field allows them
		lenMin = &one
	}
	if lenMin != nil && length >= 0 && length < *lenMin {
		return fmt.Sprintf("length must be at least %d", *lenMin)
	}
	str, _ := v.(string)
	if f.StartsWith != "" && !strings.HasPrefix(str, f.StartsWith) {
		return "should start with: " + f.StartsWith
	}
	for _, m := range f.MatchNone {
		if m.re.MatchString(str) {
			return cmpOr(m.Err, "invalid value: "+str)
		}
	}
	for _, m := range f.MatchAll {
		if !m.re.MatchString(str) {
			return cmpOr(m.Err, "invalid value: "+str)
		}
	}
	return ""
}

func (s *Schema) entityCheck(c Check, fields []map[string]*Field, obj map[string]any, path string, errs *[]string) {
	switch {
	case c.AtLeastOneOf != nil:
		if !anyNonEmpty(obj, c.AtLeastOneOf) {
			*errs = append(*errs, "at least one of these fields must be non-empty: "+quoted(path, c.AtLeastOneOf))
		}
	case c.Conditional != nil:
		k := c.Conditional
		if underNull(obj, k.IfField) {
			// Kong requires a conditional's if_field (its checker's
			// required_fields); one inside a null record is missing.
			*errs = append(*errs, join(path, k.IfField)+": field required for entity check")
			return
		}
		if !s.matches(lookup(fields, k.IfField), k.IfMatch, get(obj, k.IfField)) {
			return
		}
		thenField := lookup(fields, k.ThenField)
		then := get(obj, k.ThenField)
		var msg string
		switch {
		case then == nil && (k.ThenMatch.isRequired() || thenField.isRequired()):
			msg = "required field missing"
		case then == nil && k.ThenMatch.Eq != nil:
			// Kong's validate_field refuses a null a match wants equal
			// to a value.
			msg = fmt.Sprintf("value must be %v", k.ThenMatch.Eq)
		case then != nil:
			// The field's own validators have already reported on it.
			var nested []string
			if msg = s.value(k.ThenMatch, thenField.Type, then, "", &nested); msg != "" {
				msg += got(then)
			}
		}
		if msg != "" {
			why := fmt.Sprintf("failed conditional validation given value of field '%s'", join(path, k.IfField))
			if k.ThenErr != "" {
				msg, why = k.ThenErr+got(then), ""
			}
			*errs = append(*errs, join(path, k.ThenField)+": "+msg+parens(why))
		}
	case c.ConditionalAtLeastOneOf != nil:
		k := c.ConditionalAtLeastOneOf
		if !s.matches(lookup(fields, k.IfField), k.IfMatch, get(obj, k.IfField)) || anyNonEmpty(obj, k.ThenAtLeastOneOf) {
			return
		}
		list := quoted(path, k.ThenAtLeastOneOf)
		if k.ThenErr != "" {
			*errs = append(*errs, luaFormat(k.ThenErr, list))
		} else {
			*errs = append(*errs, "at least one of these fields must be non-empty: "+list)
		}
	}
}

// matches reports whether v passes ifMatch read over its field's own
// declaration, as Kong runs a conditional's if_match. A null passes unless
// the match wants a value (eq, required).
func (s *Schema) matches(field, ifMatch *Field, v any) bool {
	if v == nil {
		return ifMatch.Eq == nil && !ifMatch.isRequired()
	}
	var nested []string
	return s.value(overlay(field, ifMatch), field.Type, v, "", &nested) == "" && len(nested) == 0
}

// overlay is base with top's validators in place of base's: Kong reads a
// conditional's match table with the field's declaration behind it.
func overlay(base, top *Field) *Field {
	f := *base
	t := reflect.ValueOf(top).Elem()
	out := reflect.ValueOf(&f).Elem()
	for i := 0; i < t.NumField(); i++ {
		if t.Type().Field(i).IsExported() && !t.Field(i).IsZero() {
			out.Field(i).Set(t.Field(i))
		}
	}
	return &f
}

// lookup finds the declaration of a dotted path among fields.
func lookup(fields []map[string]*Field, path string) *Field {
	head, rest, nested := strings.Cut(path, ".")
	for _, entry := range fields {
		if f, ok := entry[head]; ok {
			if !nested {
				return f
			}
			return lookup(f.Fields, rest)
		}
	}
	return nil
}

// underNull says whether a dotted path runs through a record that is absent
// or null: Kong's get_field finds no value there, not a null one.
func underNull(obj map[string]any, path string) bool {
	head, rest, nested := strings.Cut(path, ".")
	if !nested {
		return false
	}
	m, ok := obj[head].(map[string]any)
	return !ok || underNull(m, rest)
}

// get reads a dotted path from a decoded object; nil when absent or null.
func get(obj map[string]any, path string) any {
	head, rest, nested := strings.Cut(path, ".")
	v := obj[head]
	if !nested {
		return v
	}
	m, _ := v.(map[string]any)
	return get(m, rest)
}

// anyNonEmpty is Kong's is_nonempty over names: not null, not "", not an
// empty array or record.
func anyNonEmpty(obj map[string]any, names []string) bool {
	for _, name := range names {
		switch v := get(obj, name).(type) {
		case nil:
		case string:
			if v != "" {
				return true
			}
		case []any:
			if len(v) > 0 {
				return true
			}
		case map[string]any:
			if len(v) > 0 {
				return true
			}
		default:
			return true
		}
	}
	return false
}

func oneOf(v any, options []any) bool {
	for _, o := range options {
		if reflect.DeepEqual(v, o) {
			return true
		}
	}
	return false
}

func quoted(path string, names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "'" + join(path, n) + "'"
	}
	return strings.Join(q, ", ")
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// got names the value a message is about.
func got(v any) string {
	if v == nil {
		return ""
	}
	b, _ := json.Marshal(v)
	return " (got " + string(b) + ")"
}

// num prints a number as declared: 999999999999999, not 9.99999999999999e+14.
func num(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

func parens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// cloneJSON deep-copies a decoded JSON value, so a default filled into one
// config is never shared with the declaration or another config.
func cloneJSON(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = cloneJSON(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = cloneJSON(e)
		}
		return out
	}
	return v
}

// Info is one plugin as a Go plugin server's -dump describes it to Kong's
// query command (kong/runloop/plugin_servers: Name, Priority, Version,
// Schema, Phases), in go-pdk's ProtoBuf protocol.
type Info struct {
	Name     string
	Version  string
	Priority int
	Phases   []string
	Socket   string // the socket Kong connects to
	// ForKong, if set, returns the schema to dump for the Kong whose
	// prefix -kong-prefix names, when the command line names one (a
	// schema that depends on Kong's settings, as Kong's own plugins'
	// do); nil keeps the schema.
	ForKong func(prefix string) (*Schema, error) `json:"-"`
}

// Dump writes what `-dump` prints: info and the full schema, as declared,
// named after the plugin.
func (s *Schema) Dump(w io.Writer, info Info) error {
	var schema map[string]any
	dec := json.NewDecoder(bytes.NewReader(s.declared))
	dec.UseNumber() // numbers exactly as declared
	if err := dec.Decode(&schema); err != nil {
		return err
	}
	schema["name"] = info.Name
	return json.NewEncoder(w).Encode(map[string]any{
		"Protocol":   "ProtoBuf:1",
		"SocketPath": info.Socket,
		"Plugins": []map[string]any{{
			"Name": info.Name, "Version": info.Version, "Priority": info.Priority, "Phases": info.Phases, "Schema": schema,
		}},
	})
}

// PluginConfig returns the config Kong sends a plugin server for a plugin
// entity as Kong's Admin API returns it (GET /plugins/{id}): its config
// with route_id and service_id added, as Kong adds them. A bare config (no
// "config" object) is returned as it is.
func PluginConfig(entity []byte) ([]byte, error) {
	var top any
	if err := json.Unmarshal(entity, &top); err != nil {
		return nil, fmt.Errorf("not a plugin or its config as JSON: %w", err)
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a plugin or its config: a JSON object is expected (got %s)", jsonKind(top))
	}
	raw, isEntity := obj["config"]
	if !isEntity {
		return entity, nil
	}
	config, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("config: expected a record (got %s)", jsonKind(raw))
	}
	for _, attached := range []string{"route", "service"} {
		if ref, ok := obj[attached].(map[string]any); ok {
			if id, ok := ref["id"].(string); ok {
				config[attached+"_id"] = id
			}
		}
	}
	return json.Marshal(config)
}

// jsonKind names a decoded JSON value's kind, for errors.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// luaFormat is Lua's format(s, arg) for a string with at most one %s:
// without one, the argument is ignored, as Lua ignores extra arguments.
func luaFormat(s, arg string) string {
	if !strings.Contains(s, "%s") {
		return s
	}
	return fmt.Sprintf(s, arg)
}
