import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A statement's parameters as C strings in the text format (NULL for SQL NULL), freed
/// with it; made before anything is sent.
///
/// libpq takes C strings, which end at a NUL: a value holding U+0000 (PostgreSQL's text
/// holds none) would reach the server cut short, as another value. Such a statement fails
/// here instead, alone, with an error that says why.
final class EncodedStatement {
    let values: [UnsafePointer<CChar>?]
    private let storage: [UnsafeMutablePointer<CChar>?]

    init(_ statement: PostgresStatement, index: Int) throws(PostgresError) {
        try Self.refuseNul(in: statement.sql, what: "the SQL text", index: index)
        var storage: [UnsafeMutablePointer<CChar>?] = []
        storage.reserveCapacity(statement.parameters.count)
        for (number, parameter) in statement.parameters.enumerated() {
            guard let text = parameter.textEncoding else {
                storage.append(nil)
                continue
            }
            do {
                try Self.refuseNul(in: text, what: "parameter $\(number + 1)", index: index)
            } catch {
                for pointer in storage { free(pointer) }
                throw error
            }
            storage.append(strdup(text))
        }
        self.storage = storage
        values = storage.map { $0.map { UnsafePointer($0) } }
    }

    deinit { for pointer in storage { free(pointer) } }

    static func refuseNul(in text: String, what: String, index: Int) throws(PostgresError) {
        guard text.holdsNUL else { return }
        throw PostgresError(kind: .statement, message: "\(what) holds U+0000, which PostgreSQL's text cannot hold "
                                + "(a C string would end there): not sent", statementIndex: index)
    }
}
