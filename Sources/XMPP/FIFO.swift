/// A first-in, first-out buffer: an array with a moving head, so taking from the front is
/// O(1) amortised; the storage is compacted once most of it has been taken.
package struct FIFO<Element> {
    private var items: [Element] = []
    private var head = 0

    package init() {}

    package var count: Int { items.count - head }
    package var isEmpty: Bool { head == items.count }
    /// What is queued, oldest first.
    package var elements: ArraySlice<Element> { items[head...] }

    package mutating func append(_ element: Element) { items.append(element) }
    package mutating func append<S: Sequence>(contentsOf elements: S) where S.Element == Element { items.append(contentsOf: elements) }

    /// Puts `elements` in front of what is queued, in their order.
    package mutating func prepend<S: Sequence>(contentsOf elements: S) where S.Element == Element {
        items = Array(elements) + items[head...]
        head = 0
    }

    /// Takes the oldest element.
    package mutating func popFirst() -> Element? {
        guard head < items.count else { return nil }
        defer {
            head += 1
            compact()
        }
        return items[head]
    }

    /// Takes up to `maximum` of the oldest elements, oldest first.
    package mutating func popFirst(_ maximum: Int) -> [Element] {
        if maximum >= count && head == 0 {
            // Everything, from the start: hand over the storage itself, no copy.
            defer { items = [] }
            return items
        }
        let taken = Array(items[head..<(head + min(maximum, count))])
        head += taken.count
        compact()
        return taken
    }

    private mutating func compact() {
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
