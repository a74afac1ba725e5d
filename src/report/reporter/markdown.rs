//! Text made safe for Markdown: what a batch printed or named, shown as itself.

/// Test output as Markdown text: one line, with a backslash before each character that
/// Markdown or HTML would read as markup where it stands, so a test name cannot forge a
/// table row, a link, emphasis or a tag; and no other, so the file still reads as plain
/// text in a terminal (`(256m)`, not `\(256m\)`).
pub fn markdown_text(text: &str) -> String {
    let chars: Vec<char> = text
        .chars()
        .map(|c| {
            if matches!(c, '\n' | '\r' | '\t') {
                ' '
            } else {
                c
            }
        })
        .filter(|c| !c.is_control())
        .skip_while(|c| *c == ' ')
        .collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 1).copied();
        let escape = match c {
            // Code spans, emphasis, tags, table cells, strikethrough.
            '`' | '*' | '<' | '|' | '~' => true,
            // A link: `[text](url)`, `[text][ref]`, or a definition `[ref]: url`, which
            // only the start of a line can hold. `[[gpu]]` and `test_x[1]` stay plain.
            '[' => i == 0,
            ']' => after.is_some_and(|a| matches!(a, '(' | '[' | ':')),
            // Only a backslash before punctuation escapes it.
            '\\' => after.is_some_and(|a| a.is_ascii_punctuation()),
            // Inside a word an underscore is a letter.
            '_' => {
                !(before.is_some_and(char::is_alphanumeric)
                    && after.is_some_and(char::is_alphanumeric))
            }
            // An entity (`&amp;`, `&#60;`).
            '&' => after.is_some_and(|a| a == '#' || a.is_ascii_alphabetic()),
            // At the start of a line: a heading, list item, quote or setext underline.
            '#' | '-' | '+' | '=' | '>' => i == 0,
            // An ordered list item: digits at the start, then `.` or `)`.
            '.' | ')' => {
                i > 0
                    && chars[..i].iter().all(char::is_ascii_digit)
                    && after.is_none_or(|a| a == ' ')
            }
            _ => false,
        };
        if escape {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `text` as an inline code span: fenced with more backticks than it holds, on one line.
pub fn code_span(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let longest = one_line
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    format!("{fence} {one_line} {fence}")
}
