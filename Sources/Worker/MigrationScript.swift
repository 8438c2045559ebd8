/// What the migrator reads in a migration's SQL before running it: the statements at its
/// top level (outside quotes, comments and dollar-quoted bodies), to refuse those that would
/// end or open the transaction the migrator runs it in. A migration holding `COMMIT` was
/// recorded as applied although what followed it ran outside that transaction, and a
/// failure after it left half a migration committed.
enum MigrationScript {
    /// Leading keywords of statements that end, open or split a transaction.
    private static let transactionControl: Set<String> = ["BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"]

    /// The first statement of `sql` that controls the transaction (its first keyword,
    /// upper-cased), or nil.
    static func transactionControlStatement(in sql: String) -> String? {
        firstKeywords(of: sql).first { transactionControl.contains($0) }
    }

    /// The first keyword of every top-level statement of `sql`, upper-cased, in order.
    static func firstKeywords(of sql: String) -> [String] {
        let text = Array(sql.utf8)
        var keywords: [String] = []
        var current: [UInt8] = []
        var statementStarted = false
        var index = 0
        func isWordByte(_ byte: UInt8) -> Bool {
            (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122) || byte == 95 || (byte >= 48 && byte <= 57)
        }
        func finishWord() {
            if !current.isEmpty, !statementStarted {
                keywords.append(String(decoding: current, as: UTF8.self).uppercased())
                statementStarted = true
            }
            current.removeAll()
        }
        while index < text.count {
            let byte = text[index]
            // -- comment to the end of the line.
            if byte == 45, index + 1 < text.count, text[index + 1] == 45 {
                finishWord()
                while index < text.count, text[index] != 10 { index += 1 }
                continue
            }
            // /* comment */, nested.
            if byte == 47, index + 1 < text.count, text[index + 1] == 42 {
                finishWord()
                var depth = 0
                while index < text.count {
                    if text[index] == 47, index + 1 < text.count, text[index + 1] == 42 { depth += 1; index += 2; continue }
                    if text[index] == 42, index + 1 < text.count, text[index + 1] == 47 {
                        depth -= 1
                        index += 2
                        if depth == 0 { break }
                        continue
                    }
                    index += 1
                }
                continue
            }
            // 'string' ('' inside), E'string' (backslash escapes), "identifier".
            if byte == 39 || byte == 34 {
                let escapes = byte == 39 && current.count == 1 && (current[0] == 69 || current[0] == 101)
                finishWord()
                statementStarted = true
                index += 1
                while index < text.count {
                    if escapes, text[index] == 92 { index += 2; continue }
                    if text[index] == byte {
                        if index + 1 < text.count, text[index + 1] == byte { index += 2; continue }
                        break
                    }
                    index += 1
                }
                index += 1
                continue
            }
            // $tag$ body $tag$.
            if byte == 36, current.isEmpty || !current.allSatisfy(isWordByte) {
                var end = index + 1
                while end < text.count, isWordByte(text[end]), !(text[end] >= 48 && text[end] <= 57 && end == index + 1) { end += 1 }
                if end < text.count, text[end] == 36 {
                    finishWord()
                    statementStarted = true
                    let tag = Array(text[index...end])
                    index = end + 1
                    while index < text.count {
                        if text[index] == 36, index + tag.count <= text.count, Array(text[index..<index + tag.count]) == tag {
                            index += tag.count
                            break
                        }
                        index += 1
                    }
                    continue
                }
            }
            if byte == 59 {
                finishWord()
                statementStarted = false
            } else if isWordByte(byte) {
                current.append(byte)
            } else {
                finishWord()
                if byte > 32 { statementStarted = true }
            }
            index += 1
        }
        finishWord()
        return keywords
    }
}
