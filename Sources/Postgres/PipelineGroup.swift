/// How `PostgresConnection.pipeline` sends a list of statements that holds a COPY.
///
/// libpq runs no COPY in pipeline mode, and a simple query takes no parameters: so each
/// COPY joins the statements without parameters right before and after it in one simple
/// query (`BEGIN; COPY …; COMMIT` goes as one), and the statements with parameters run
/// pipelined between those queries. The order of the statements is kept.
enum PipelineGroup: Equatable {
    /// Indexes of statements sent together in pipeline mode.
    case pipelined([Int])
    /// Indexes of statements sent together as one simple query (a COPY among them).
    case simple([Int])

    static func split(_ statements: [PostgresStatement]) -> [PipelineGroup] {
        var groups: [PipelineGroup] = []
        var pipe: [Int] = []
        /// Statements without parameters not placed yet: they join a COPY that follows.
        var loose: [Int] = []
        /// The last group is a simple query that statements without parameters may still join.
        var simpleOpen = false
        for (index, statement) in statements.enumerated() {
            if statement.copyData != nil {
                if !pipe.isEmpty { groups.append(.pipelined(pipe)) }
                pipe = []
                groups.append(.simple(loose + [index]))
                loose = []
                simpleOpen = true
            } else if statement.parameters.isEmpty {
                if simpleOpen, case .simple(let indices) = groups.last {
                    groups[groups.count - 1] = .simple(indices + [index])
                } else {
                    loose.append(index)
                }
            } else {
                simpleOpen = false
                pipe += loose + [index]
                loose = []
            }
        }
        pipe += loose
        if !pipe.isEmpty { groups.append(.pipelined(pipe)) }
        return groups
    }
}
