/// A first-in, first-out buffer: an array with a moving head, so taking from the front is
/// O(1) amortised; the storage is compacted once most of it has been taken.
///
/// Taken elements are moved out (their slot left nil), not copied: a copy would cost a
/// retain now and a release at compaction for every element that holds a reference.
///
/// The type is `public` and its members `package`: Swift 6.3 neither inlines nor specializes
/// the `@inlinable` members of a `package` type in other modules, which then called them
/// unspecialized, looking generic metadata up at run time at every call.
public struct FIFO<Element> {
    @usableFromInline var items: [Element?] = []
    @usableFromInline var head = 0

    @inlinable package init() {}

    @inlinable package var count: Int { items.count - head }
    @inlinable package var isEmpty: Bool { head == items.count }
    /// What is queued, oldest first.
    @inlinable package var elements: [Element] { items[head...].map { $0! } }

    @inlinable package mutating func append(_ element: Element) { items.append(element) }
    @inlinable package mutating func append<S: Sequence>(contentsOf elements: S) where S.Element == Element {
        items.append(contentsOf: elements.lazy.map { Optional($0) })
    }

    /// Puts `elements` in front of what is queued, in their order.
    @inlinable package mutating func prepend<S: Sequence>(contentsOf elements: S) where S.Element == Element {
        items = elements.map { Optional($0) } + items[head...]
        head = 0
    }

    /// The oldest element, left in place.
    @inlinable package var first: Element? { head < items.count ? items[head] : nil }

    /// True when an element satisfies `predicate`.
    @inlinable package func contains(where predicate: (Element) -> Bool) -> Bool {
        items[head...].contains { predicate($0!) }
    }

    /// Takes the oldest element.
    @inlinable package mutating func popFirst() -> Element? {
        guard head < items.count else { return nil }
        defer {
            head += 1
            compact()
        }
        return items[head].take()
    }

    /// Takes up to `maximum` of the oldest elements, oldest first.
    @inlinable package mutating func popFirst(_ maximum: Int) -> [Element] {
        let end = head + min(maximum, count)
        var taken: [Element] = []
        taken.reserveCapacity(end - head)
        for index in head..<end { taken.append(items[index].take()!) }
        head = end
        compact()
        return taken
    }

    @inlinable mutating func compact() {
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 1024 && head * 2 > items.count {
            items.removeFirst(head)
            head = 0
        }
    }
}

extension FIFO: Sendable where Element: Sendable {}
