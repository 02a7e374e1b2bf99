// Package enum names the small enumerations of core's packages (algorithms,
// header styles, failure policies) and reads them back from config words.
package enum
