//! A deserialiser's message in plain words, with the file's own key: serde says "invalid type:
//! floating point `2.0`, expected u32" or "unknown field `x`, expected one of `a`, `b`"; a user
//! reads `mxu.count = 2.0: expected a whole number from 0 to 4294967295` and
//! `unknown key 'x'; the keys here are a, b`. The path comes from `serde_path_to_error` at the
//! call site (the file's keys, dotted; list items as `[i]`).

/// `message` (a serde error's text, without position) about the value at `path` (the keys
/// leading to it, dotted; empty for the top level), in plain words: the key, the value and what
/// is allowed.
pub fn plain_error(path: &str, message: &str) -> String {
    let at = |rest: String| if path.is_empty() { rest } else { format!("{path}: {rest}") };
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (name, expected) = rest.split_once(", ").unwrap_or((rest, ""));
        let keys = expected.strip_prefix("expected one of ").or_else(|| expected.strip_prefix("expected ")).map(unquote_list);
        // The path of an unknown key ends in the key itself: name the table it is in.
        let table = path.strip_suffix(unquote(name)).map(|p| p.trim_end_matches('.')).unwrap_or(path);
        let at = |rest: String| if table.is_empty() { rest } else { format!("{table}: {rest}") };
        return at(match keys {
            Some(k) => format!("unknown key '{}'; the keys here are {k}", unquote(name)),
            None => format!("unknown key '{}'; no key is allowed here", unquote(name)),
        });
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return at(format!("missing key '{}'", unquote(rest.trim())));
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.rsplit_once(", expected ") {
                let value = found_value(found);
                let words = expected_words(expected);
                return if path.is_empty() { format!("{value}: expected {words}") } else { format!("{path} = {value}: expected {words}") };
            }
        }
    }
    if let Some(rest) = message.strip_prefix("invalid length ") {
        return at(format!("wrong number of items: {}", rest.replace(", expected", "; expected")));
    }
    at(message.to_string())
}

fn unquote(s: &str) -> &str {
    s.trim().trim_matches('`')
}

fn unquote_list(s: &str) -> String {
    s.split(", ").map(unquote).collect::<Vec<_>>().join(", ")
}

/// The value in serde's "found" part: "floating point `2.0`" -> 2.0, "string \"10\"" -> "10".
fn found_value(found: &str) -> String {
    for kind in ["floating point ", "integer ", "boolean ", "character "] {
        if let Some(v) = found.strip_prefix(kind) {
            return unquote(v).to_string();
        }
    }
    if let Some(v) = found.strip_prefix("string ") {
        return v.to_string();
    }
    match found {
        "sequence" => "a list".into(),
        "map" => "a table".into(),
        "unit value" | "null" => "null".into(),
        other => other.to_string(),
    }
}

/// serde's "expected" part in words.
fn expected_words(expected: &str) -> String {
    let e = expected.trim();
    let max = match e {
        "u8" => Some(u64::from(u8::MAX)),
        "u16" => Some(u64::from(u16::MAX)),
        "u32" => Some(u64::from(u32::MAX)),
        "u64" | "usize" => Some(u64::MAX),
        _ => None,
    };
    if let Some(m) = max {
        return format!("a whole number from 0 to {m}");
    }
    match e {
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a string" | "a borrowed string" => "text".into(),
        "a sequence" => "a list".into(),
        "a map" => "a table".into(),
        other if other.starts_with("struct ") => "a table".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::plain_error;

    #[test]
    fn serde_messages_become_plain_words() {
        assert_eq!(
            plain_error("mxu.count", "invalid type: floating point `2.0`, expected u32"),
            "mxu.count = 2.0: expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            plain_error("block_q", "invalid value: integer `-512`, expected u64"),
            "block_q = -512: expected a whole number from 0 to 18446744073709551615"
        );
        assert_eq!(
            plain_error("", "unknown field `extra`, expected one of `q_len`, `kv_len`, `block_q`, `block_kv`, `blocks`"),
            "unknown key 'extra'; the keys here are q_len, kv_len, block_q, block_kv, blocks"
        );
        assert_eq!(plain_error("heads", "invalid type: string \"10\", expected u64"), "heads = \"10\": expected a whole number from 0 to 18446744073709551615");
        assert_eq!(plain_error("mxu", "missing field `rows`"), "mxu: missing key 'rows'");
    }
}
