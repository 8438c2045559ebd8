import Testing
@testable import Upstream
@testable import Worker

/// The statements at a migration's top level, which the migrator reads to refuse one that
/// ends or opens its transaction.
@Suite struct MigrationScriptTests {
    @Test func topLevelStatementsAreFoundOutsideQuotesCommentsAndDollarQuotedBodies() {
        let sql = """
            CREATE TABLE t (note text DEFAULT 'COMMIT; BEGIN');  -- COMMIT in a comment
            /* ROLLBACK; /* nested */ END; */
            CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $body$ BEGIN COMMIT; END $body$;
            DO $$ BEGIN RAISE NOTICE 'x'; END $$;
            INSERT INTO "COMMIT" VALUES (E'it\\'s; COMMIT');
            """
        #expect(MigrationScript.firstKeywords(of: sql) == ["CREATE", "CREATE", "DO", "INSERT"])
        #expect(MigrationScript.transactionControlStatement(in: sql) == nil)
    }

    @Test func transactionControlIsFound() {
        for (sql, keyword) in [("CREATE TABLE a (id int);\nCOMMIT;\nCREATE TABLE b (id int);", "COMMIT"),
                               ("begin; create table a (id int); end;", "BEGIN"),
                               ("CREATE TABLE a (id int); rollback", "ROLLBACK"),
                               ("START TRANSACTION; SELECT 1;", "START")] {
            #expect(MigrationScript.transactionControlStatement(in: sql) == keyword, "\(sql)")
        }
    }
}
