package usage

// jsonScanner reads JSON a byte at a time and hands its Scanner the whole
// numbers of a usage object's members: an object under the key usage or
// usageMetadata at most two objects deep (OpenAI's and Gemini's at the
// top, Anthropic's message_start event's under its message), so a tool
// call's own arguments never count. It keeps the kind of each open
// container (up to maxDepth; deeper, it stops reading), the key being
// read (up to maxKey bytes: longer keys are none of the usage fields)
// and the number being read: a fixed size, whatever the body.
type jsonScanner struct {
	state  jsonState
	depth  int
	objs   [maxDepth / 64]uint64 // bit d: the container at depth d+1 is an object
	key    [maxKey]byte
	nkey   int
	usage  int // depth of the usage object being read, 0 outside one
	num    int64
	digits int
	bad    bool // the number is not a whole number at least 0
	broken bool // not JSON as far as the scanner follows it: read nothing more
}

const (
	maxDepth = 256
	maxKey   = 32
)

// jsonState is what the scanner expects next.
type jsonState uint8

const (
	expectValue    jsonState = iota // a value: at the start, after ':', after '[' or ',' in an array
	expectKey                       // a key or '}': after '{' or ',' in an object
	inKey                           // inside a key's string
	inKeyEscape                     // after '\' in a key
	expectColon                     // after a key
	inString                        // inside a string value
	inStringEscape                  // after '\' in a string value
	inNumber                        // inside a number
	inLiteral                       // inside true, false or null
	afterValue                      // after a value: ',' or the container's end
)

// isObject reports whether the container at depth d (1 the outermost) is
// an object.
func (j *jsonScanner) isObject(d int) bool { return j.objs[(d-1)/64]&(1<<((d-1)%64)) != 0 }

// open starts a container after its first byte.
func (j *jsonScanner) open(object bool) {
	if j.depth == maxDepth {
		j.broken = true
		return
	}
	// A usage object: its key is the one just read, and it is a member
	// of the outermost object or of an object that is one's member.
	if object && j.usage == 0 && j.depth >= 1 && j.depth <= 2 && j.isObject(1) && j.isObject(j.depth) &&
		(string(j.key[:j.nkey]) == "usage" || string(j.key[:j.nkey]) == "usageMetadata") {
		j.usage = j.depth + 1
	}
	j.depth++
	bit := uint64(1) << ((j.depth - 1) % 64)
	if object {
		j.objs[(j.depth-1)/64] |= bit
		j.state = expectKey
	} else {
		j.objs[(j.depth-1)/64] &^= bit
		j.state = expectValue
	}
	j.nkey = 0
}

// close ends the container at the current depth with c ('}' or ']').
func (j *jsonScanner) close(c byte) {
	if j.depth == 0 || j.isObject(j.depth) != (c == '}') {
		j.broken = true
		return
	}
	if j.usage == j.depth {
		j.usage = 0
	}
	j.depth--
	j.state = afterValue
}

// endNumber hands a number that ended to s when it is a usage member's.
func (j *jsonScanner) endNumber(s *Scanner) {
	if j.usage != 0 && j.usage == j.depth && !j.bad && j.digits > 0 {
		s.record(j.key[:j.nkey], j.num)
	}
	j.state = afterValue
}

// scan reads p.
func (j *jsonScanner) scan(p []byte, s *Scanner) {
	for i := 0; i < len(p) && !j.broken; i++ {
		c := p[i]
		switch j.state {
		case inString:
			// The bulk of an answer: skip to the string's end or escape.
			for i < len(p) && p[i] != '"' && p[i] != '\\' {
				i++
			}
			if i == len(p) {
				return
			}
			if p[i] == '\\' {
				j.state = inStringEscape
			} else {
				j.state = afterValue
			}
			continue
		case inStringEscape:
			j.state = inString
			continue
		case inKey:
			switch c {
			case '"':
				j.state = expectColon
			case '\\':
				j.state = inKeyEscape
			default:
				j.addKey(c)
			}
			continue
		case inKeyEscape:
			j.addKey(c)
			j.state = inKey
			continue
		case inNumber:
			switch {
			case c >= '0' && c <= '9':
				if j.digits < 18 {
					j.num = j.num*10 + int64(c-'0')
				} else {
					j.num = 1 << 62 // more digits than a count holds: clamped when read
				}
				j.digits++
				continue
			case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-':
				j.bad = true // not a whole number
				continue
			}
			j.endNumber(s)
		case inLiteral:
			if c >= 'a' && c <= 'z' {
				continue
			}
			j.state = afterValue
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		switch j.state {
		case expectValue:
			j.value(c)
		case expectKey:
			switch c {
			case '"':
				j.state, j.nkey = inKey, 0
			case '}':
				j.close(c)
			default:
				j.broken = true
			}
		case expectColon:
			if c != ':' {
				j.broken = true
			}
			j.state = expectValue
		case afterValue:
			switch {
			case c == ',' && j.depth > 0:
				j.state = expectValue
				if j.isObject(j.depth) {
					j.state = expectKey
				}
			case c == '}' || c == ']':
				j.close(c)
			default:
				j.broken = true
			}
		}
	}
}

// value starts the value whose first byte is c.
func (j *jsonScanner) value(c byte) {
	switch {
	case c == '{':
		j.open(true)
	case c == '[':
		j.open(false)
	case c == ']' && j.depth > 0 && !j.isObject(j.depth):
		j.close(c) // an empty array
	case c == '"':
		j.state = inString
	case c >= '0' && c <= '9':
		j.state, j.num, j.digits, j.bad = inNumber, int64(c-'0'), 1, false
	case c == '-':
		j.state, j.num, j.digits, j.bad = inNumber, 0, 0, true // negative: never a count
	case c >= 'a' && c <= 'z':
		j.state = inLiteral
	default:
		j.broken = true
	}
}

// addKey appends c to the key being read; a key longer than maxKey is
// none of the usage fields, and is kept as its first maxKey bytes and a
// mark that matches no name.
func (j *jsonScanner) addKey(c byte) {
	if j.nkey < maxKey {
		j.key[j.nkey] = c
		j.nkey++
		return
	}
	j.key[maxKey-1] = 0 // no usage field's name holds a NUL
}
