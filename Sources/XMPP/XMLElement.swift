/// An XML element of an XMPP stream, with namespaces resolved.
///
/// `name` is the local name and `namespace` the resolved namespace URI, so
/// `<data:gcm xmlns:data="google:mobile:data">` and `<gcm xmlns="google:mobile:data">` are
/// equal. Prefixes are not kept.
public struct XMLElement: Sendable, Equatable, CustomStringConvertible {
    /// A child of an element: an element or a run of text.
    public enum Node: Sendable, Equatable {
        case element(XMLElement)
        case text(String)
    }

    /// An attribute; `namespace` is nil for the usual unprefixed attributes.
    public struct Attribute: Sendable, Equatable {
        public var name: String
        public var namespace: String?
        public var value: String

        public init(name: String, namespace: String? = nil, value: String) {
            self.name = name
            self.namespace = namespace
            self.value = value
        }
    }

    public var name: String
    public var namespace: String?
    public var attributes: [Attribute]
    public var children: [Node]

    /// Makes an element; `attributes` are unprefixed ones, in the order given.
    public init(_ name: String, namespace: String? = nil, attributes: KeyValuePairs<String, String> = [:], children: [Node] = []) {
        self.name = name
        self.namespace = namespace
        self.attributes = attributes.map { Attribute(name: $0.key, value: $0.value) }
        self.children = children
    }

    /// Makes an element with the given attributes list.
    public init(name: String, namespace: String?, attributeList: [Attribute], children: [Node]) {
        self.name = name
        self.namespace = namespace
        self.attributes = attributeList
        self.children = children
    }

    /// The value of the unprefixed attribute `name`, if present.
    public func attribute(_ name: String) -> String? {
        attributes.first { $0.name == name && $0.namespace == nil }?.value
    }

    /// Sets (or adds) the unprefixed attribute `name`.
    public mutating func setAttribute(_ name: String, _ value: String) {
        if let index = attributes.firstIndex(where: { $0.name == name && $0.namespace == nil }) {
            attributes[index].value = value
        } else {
            attributes.append(Attribute(name: name, value: value))
        }
    }

    /// The child elements, in document order.
    public var elements: [XMLElement] {
        children.compactMap { if case .element(let element) = $0 { element } else { nil } }
    }

    /// The first child element with this local name and, when given, namespace.
    public func child(_ name: String, namespace: String? = nil) -> XMLElement? {
        for case .element(let element) in children where element.name == name {
            if namespace == nil || element.namespace == namespace { return element }
        }
        return nil
    }

    /// The concatenated text directly inside this element.
    public var text: String {
        var result = ""
        for case .text(let run) in children { result += run }
        return result
    }

    /// The element as XML text in which `inheritedNamespace` is the default namespace of
    /// the context (for stanzas, the stream's `jabber:client`).
    public func serialized(inheritedNamespace: String? = XMPPNamespace.client) -> String {
        var output = ""
        output.reserveCapacity(128)
        write(to: &output, inheritedNamespace: inheritedNamespace)
        return output
    }

    public var description: String { serialized() }

    func write(to output: inout String, inheritedNamespace: String?) {
        output += "<"
        output += name
        if let namespace, namespace != inheritedNamespace {
            output += " xmlns=\""
            XMLEscaping.appendAttribute(namespace, to: &output)
            output += "\""
        }
        for (index, attribute) in attributes.enumerated() {
            output += " "
            if let namespace = attribute.namespace {
                if namespace == XMPPNamespace.xml {
                    output += "xml:"
                } else {
                    // Rare in XMPP stanzas: declare a prefix of our own for it.
                    output += "xmlns:a\(index)=\""
                    XMLEscaping.appendAttribute(namespace, to: &output)
                    output += "\" a\(index):"
                }
            }
            output += attribute.name
            output += "=\""
            XMLEscaping.appendAttribute(attribute.value, to: &output)
            output += "\""
        }
        if children.isEmpty {
            output += "/>"
            return
        }
        output += ">"
        let namespaceHere = namespace ?? inheritedNamespace
        for child in children {
            switch child {
            case .element(let element): element.write(to: &output, inheritedNamespace: namespaceHere)
            case .text(let text): XMLEscaping.appendText(text, to: &output)
            }
        }
        output += "</"
        output += name
        output += ">"
    }
}

/// The XML namespaces the client and simulator use.
public enum XMPPNamespace {
    public static let client = "jabber:client"
    public static let streams = "http://etherx.jabber.org/streams"
    public static let sasl = "urn:ietf:params:xml:ns:xmpp-sasl"
    public static let bind = "urn:ietf:params:xml:ns:xmpp-bind"
    public static let session = "urn:ietf:params:xml:ns:xmpp-session"
    public static let stanzas = "urn:ietf:params:xml:ns:xmpp-stanzas"
    public static let streamErrors = "urn:ietf:params:xml:ns:xmpp-streams"
    public static let ping = "urn:xmpp:ping"
    public static let xml = "http://www.w3.org/XML/1998/namespace"
    /// FCM's payload element namespace (`<gcm xmlns="google:mobile:data">`).
    public static let gcm = "google:mobile:data"
}
